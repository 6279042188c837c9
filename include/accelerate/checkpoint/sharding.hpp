// Hugging Face model files: save_model() writes model.safetensors or size-capped shards with
// model.safetensors.index.json, as Accelerate and transformers do; load_checkpoint_in_model()
// reads a file, an index or a folder back into a module, strictly by default.
#pragma once

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <accelerate/checkpoint/atomic_dir.hpp>
#include <accelerate/checkpoint/files.hpp>
#include <accelerate/checkpoint/module_state.hpp>
#include <accelerate/checkpoint/safetensors.hpp>
#include <accelerate/detail/check.hpp>

namespace accelerate {

/// How save_model() writes.
/// Example:
///   acc.save_model(model, "out", {.max_shard_size = "1GB"});
struct SaveModelOptions {
  /// Shard size cap: bytes, or a string like "1GB", "500MB" (decimal, as Accelerate's
  /// save_model), "2GiB" (binary).
  std::variant<std::uint64_t, std::string> max_shard_size = std::string("10GB");
  /// Safetensors only: false (pickled pytorch_model.bin) is refused, since this library never
  /// writes or reads pickle.
  bool safe_serialization = true;
};

namespace checkpoint {

/// Bytes of a size such as "1GB" (10^9), "500MB", "2.5KB", "4GiB" (2^32) or "1234";
/// units are case-insensitive. Anything else is an error naming the text.
inline std::uint64_t parse_size(const std::string& text) {
  // Read by hand, not by std::regex: <regex> alone cost every trainer's translation unit about
  // 55 KB of object code (bench/README.md, compile cost).
  const auto in = [&](std::size_t i, char low, char high) { return i < text.size() && text[i] >= low && text[i] <= high; };
  const auto space = [&](std::size_t i) { return i < text.size() && std::isspace(static_cast<unsigned char>(text[i])); };
  std::size_t i = 0;
  while (space(i)) ++i;
  const std::size_t number_begin = i;
  while (in(i, '0', '9')) ++i;
  bool shaped = i > number_begin;
  if (shaped && i < text.size() && text[i] == '.') {
    const std::size_t fraction = ++i;
    while (in(i, '0', '9')) ++i;
    shaped = i > fraction;
  }
  const std::size_t number_end = i;
  while (space(i)) ++i;
  const std::size_t unit_begin = i;
  while (in(i, 'a', 'z') || in(i, 'A', 'Z')) ++i;
  std::string unit = text.substr(unit_begin, i - unit_begin);
  while (space(i)) ++i;
  ACCELERATE_CHECK(shaped && i == text.size(), "max_shard_size: '", text,
                   "' is not a size such as \"1GB\", \"500MB\" or a byte count");
  const std::string spelled = unit;
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> units = {
      {"", 1},       {"B", 1},           {"KB", 1e3},          {"MB", 1e6},          {"GB", 1e9},
      {"TB", 1e12},  {"KIB", 1024.0},    {"MIB", 1048576.0},   {"GIB", 1073741824.0},
      {"TIB", 1099511627776.0}};
  const auto it = units.find(unit);
  ACCELERATE_CHECK(it != units.end(), "max_shard_size: unknown unit '", spelled, "' in '", text,
                   "' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
  double number = 0;  // from_chars: the decimal point is '.' whatever the C locale says
  std::from_chars(text.data() + number_begin, text.data() + number_end, number);
  const double bytes = number * it->second;
  ACCELERATE_CHECK(bytes >= 1 && bytes < 1.8e19, "max_shard_size: '", text, "' is out of range");
  return static_cast<std::uint64_t>(bytes);
}

inline std::uint64_t shard_size_bytes(const std::variant<std::uint64_t, std::string>& size) {
  if (const auto* bytes = std::get_if<std::uint64_t>(&size)) {
    ACCELERATE_CHECK(*bytes > 0, "max_shard_size must be > 0");
    return *bytes;
  }
  return parse_size(std::get<std::string>(size));
}

/// One shard: tensor names in state-dict order and their bytes.
struct Shard {
  std::vector<std::string> names;
  std::uint64_t bytes = 0;
};

/// A tensor as save_model plans its files, without its values: a sharded model is planned
/// before any of its parameters is gathered. Tensors with one non-null `identity` are tied
/// weights: the first is written, the others are left out.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  const void* identity = nullptr;

  std::uint64_t bytes() const {
    std::uint64_t elements = 1;
    for (const int64_t d : shape) elements *= static_cast<std::uint64_t>(d);
    return elements * c10::elementSize(dtype);
  }
};

/// The spec of a tensor one holds: tied when it shares storage with another (an empty tensor
/// never counts as tied).
inline TensorSpec spec_of(const std::string& name, const at::Tensor& tensor) {
  const void* storage = tensor.numel() > 0 ? tensor.storage().data() : nullptr;
  return {name, std::vector<int64_t>(tensor.sizes().begin(), tensor.sizes().end()), tensor.scalar_type(), storage};
}

/// huggingface_hub's split, in state-dict order without bin packing: a tensor larger than the
/// cap gets a shard of its own; otherwise a shard closes when the next tensor would overflow
/// it. Tied tensors after the first are left out and listed in `tied` (name -> the name kept).
inline std::vector<Shard> split_into_shards(const std::vector<TensorSpec>& specs, std::uint64_t cap,
                                            std::map<std::string, std::string>* tied) {
  std::vector<Shard> shards(1);
  std::map<const void*, std::string> seen;
  for (const auto& spec : specs) {
    if (spec.identity != nullptr) {
      const auto [it, inserted] = seen.emplace(spec.identity, spec.name);
      if (!inserted) {
        if (tied) (*tied)[spec.name] = it->second;
        continue;
      }
    }
    const auto bytes = spec.bytes();
    if (bytes > cap) {
      if (!shards.back().names.empty()) shards.emplace_back();
      shards.back().names.push_back(spec.name);
      shards.back().bytes = bytes;
      shards.emplace_back();
      continue;
    }
    if (shards.back().bytes + bytes > cap && !shards.back().names.empty()) shards.emplace_back();
    shards.back().names.push_back(spec.name);
    shards.back().bytes += bytes;
  }
  if (shards.back().names.empty() && shards.size() > 1) shards.pop_back();
  return shards;
}

/// The same for tensors one holds (tied: sharing storage with an earlier one).
inline std::vector<Shard> split_into_shards(const std::vector<std::pair<std::string, at::Tensor>>& state,
                                            std::uint64_t cap, std::map<std::string, std::string>* tied) {
  std::vector<TensorSpec> specs;
  specs.reserve(state.size());
  for (const auto& [name, tensor] : state) specs.push_back(spec_of(name, tensor));
  return split_into_shards(specs, cap, tied);
}

/// "model-00002-of-00005.safetensors".
inline std::string shard_file_name(std::size_t index, std::size_t count) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buffer;
}

/// Whether `name` is a file save_model writes (and so replaces): model.safetensors, its index,
/// or a shard "model-NNNNN-of-NNNNN.safetensors".
inline bool is_model_file(const std::string& name) {
  if (name == "model.safetensors" || name == "model.safetensors.index.json") return true;
  const std::string_view pattern = "model-#####-of-#####.safetensors";  // '#': a digit
  if (name.size() != pattern.size()) return false;
  for (std::size_t i = 0; i < name.size(); ++i)
    if (pattern[i] == '#' ? !std::isdigit(static_cast<unsigned char>(name[i])) : name[i] != pattern[i]) return false;
  return true;
}

/// The metadata key tying the shards of one save to its index.
inline constexpr const char* save_id_key = "accelerate_save_id";

/// Writes the files of one save_model shard by shard, so that only the tensors of the shard
/// being written need to exist at once (a sharded model gathers each shard's parameters just
/// before it is written): model.safetensors, or shards plus model.safetensors.index.json
/// ({"metadata": {"total_size"}, "weight_map"}, keys sorted, 2-space indent).
/// Replacing a model is atomic: the files are written into a hidden sibling folder with the
/// folder's other files (hard links: configs, tokenizers stay), which takes the folder's place
/// in one rename at commit(); a writer destroyed before commit() removes what it wrote and
/// leaves the folder as it was. Shards and index carry one save id, so a loader refuses
/// shards that do not belong together.
/// Example:
///   checkpoint::ModelFilesWriter writer(dir, specs, {.max_shard_size = "1GB"});
///   for (std::size_t i = 0; i < writer.shards().size(); ++i) writer.write_shard(i, tensors_of(writer.shards()[i]));
///   writer.commit();
class ModelFilesWriter {
 public:
  ModelFilesWriter(const std::filesystem::path& dir, const std::vector<TensorSpec>& specs,
                   const SaveModelOptions& options = {})
      : dir_(dir) {
    namespace fs = std::filesystem;
    ACCELERATE_CHECK(options.safe_serialization,
                     "save_model: safe_serialization=false would write a pickle (pytorch_model.bin); "
                     "accelerate-cpp never writes or reads pickle, only safetensors");
    const PathKind kind = path_kind(dir, "save_model");
    ACCELERATE_CHECK(kind == PathKind::missing || kind == PathKind::directory, "save_model: ", dir.string(),
                     " is a file, not a folder");
    target_ = fs::absolute(dir).lexically_normal();
    if (target_.filename().empty()) target_ = target_.parent_path();  // "out/"
    ACCELERATE_CHECK(target_ != target_.root_path() && target_ != fs::current_path(), "save_model: ", dir.string(),
                     " is the current folder or the root; give the model a folder of its own");
    shards_ = split_into_shards(specs, shard_size_bytes(options.max_shard_size), &tied_);
    for (const auto& spec : specs) specs_.emplace(spec.name, spec);

    fs::create_directories(target_.parent_path());
    staging_ = begin_staging(target_);
    try {
      // What else the folder holds comes along, by hard link (copied where links cannot be made).
      if (kind == PathKind::directory) {
        for (const auto& entry : fs::directory_iterator(target_)) {
          if (is_model_file(entry.path().filename().string())) continue;
          std::error_code ec;
          fs::copy(entry.path(), staging_ / entry.path().filename(),
                   fs::copy_options::recursive | fs::copy_options::create_hard_links, ec);
          if (ec) fs::copy(entry.path(), staging_ / entry.path().filename(), fs::copy_options::recursive);
        }
      }
    } catch (...) {
      discard();
      throw;
    }
    std::random_device entropy;
    std::ostringstream id;
    id << std::hex << entropy() << entropy() << entropy() << entropy();
    save_id_ = id.str();
  }
  ModelFilesWriter(const ModelFilesWriter&) = delete;
  ModelFilesWriter& operator=(const ModelFilesWriter&) = delete;
  ~ModelFilesWriter() { if (!committed_) discard(); }

  /// The files' plan: each shard's tensor names (state-dict order, tied copies left out).
  const std::vector<Shard>& shards() const noexcept { return shards_; }
  /// Tied names left out of the files (name -> the name written).
  const std::map<std::string, std::string>& tied() const noexcept { return tied_; }

  /// Writes shard `index` (shards are written in order) from `tensors`, which must hold
  /// exactly its names with the planned shapes and dtypes; the file is fsynced.
  void write_shard(std::size_t index, const std::map<std::string, at::Tensor>& tensors) {
    ACCELERATE_CHECK(!committed_ && index == written_ && index < shards_.size(), "save_model: shard ", index + 1,
                     " of ", shards_.size(), " written out of order (", written_, " written so far)");
    const Shard& shard = shards_[index];
    std::map<std::string, at::Tensor> out;
    for (const auto& name : shard.names) {
      const auto it = tensors.find(name);
      ACCELERATE_CHECK(it != tensors.end(), "save_model: shard ", index + 1, " lacks tensor '", name, "'");
      const TensorSpec& spec = specs_.at(name);
      ACCELERATE_CHECK(it->second.sizes() == at::IntArrayRef(spec.shape) && it->second.scalar_type() == spec.dtype,
                       "save_model: tensor '", name, "' is ", it->second.sizes(), " ", it->second.scalar_type(),
                       ", planned as ", at::IntArrayRef(spec.shape), " ", spec.dtype);
      out.emplace(name, it->second);
    }
    const std::string file = shards_.size() == 1 ? "model.safetensors" : shard_file_name(index, shards_.size());
    std::map<std::string, std::string> metadata{{"format", "pt"}};
    if (shards_.size() > 1) metadata[save_id_key] = save_id_;
    save_safetensors(staging_ / file, out, metadata);
    for (const auto& name : shard.names) weight_map_[name] = file;
    total_ += shard.bytes;
    files_.push_back(file);
    ++written_;
  }

  /// Writes the index (several shards) and puts the folder in place. Returns the files.
  std::vector<std::filesystem::path> commit() {
    ACCELERATE_CHECK(!committed_ && written_ == shards_.size(), "save_model: committing after ", written_, " of ",
                     shards_.size(), " shards");
    if (shards_.size() > 1) {
      const nlohmann::json index = {{"metadata", {{"total_size", total_}, {save_id_key, save_id_}}},
                                    {"weight_map", weight_map_}};
      const auto index_path = staging_ / "model.safetensors.index.json";
      {
        std::ofstream out(index_path);
        out << index.dump(2) << '\n';
        out.flush();
        ACCELERATE_CHECK(out.good(), "save_model: writing ", (dir_ / "model.safetensors.index.json").string(),
                         " failed (disk full?)");
      }
      fsync_path(index_path);
      files_.push_back("model.safetensors.index.json");
    }
    commit_staging(target_);
    committed_ = true;
    std::vector<std::filesystem::path> written;
    for (const auto& name : files_) written.push_back(dir_ / name);
    return written;
  }

 private:
  void discard() noexcept {
    std::error_code ignored;
    std::filesystem::remove_all(staging_, ignored);
  }

  std::filesystem::path dir_, target_, staging_;
  std::vector<Shard> shards_;
  std::map<std::string, std::string> tied_;
  std::map<std::string, TensorSpec> specs_;
  std::string save_id_;
  nlohmann::json weight_map_ = nlohmann::json::object();
  std::uint64_t total_ = 0;
  std::vector<std::string> files_;
  std::size_t written_ = 0;
  bool committed_ = false;
};

/// Writes a module's parameters and buffers as Hugging Face safetensors into `dir` with
/// ModelFilesWriter (atomic replacement, one save id). Returns the files written.
/// (Accelerator::save_model calls this on the main process only.)
/// This overload takes the tensors themselves (names in state_dict order); the other takes
/// them from a module.
inline std::vector<std::filesystem::path> write_model_files(
    const std::vector<std::pair<std::string, at::Tensor>>& state, const std::filesystem::path& dir,
    const SaveModelOptions& options = {}) {
  std::vector<TensorSpec> specs;
  specs.reserve(state.size());
  for (const auto& [name, tensor] : state) specs.push_back(spec_of(name, tensor));
  ModelFilesWriter writer(dir, specs, options);
  const std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  for (std::size_t i = 0; i < writer.shards().size(); ++i) writer.write_shard(i, by_name);
  return writer.commit();
}

inline std::vector<std::filesystem::path> write_model_files(const torch::nn::Module& module,
                                                            const std::filesystem::path& dir,
                                                            const SaveModelOptions& options = {}) {
  return write_model_files(named_tensors(module), dir, options);
}

/// A model.safetensors.index.json as read: tensor names grouped by shard file, and the save id
/// save_model records ("" for other writers' indexes).
struct ModelIndex {
  std::map<std::string, std::vector<std::string>> by_file;
  std::string save_id;
};

/// Reads a model.safetensors.index.json. Malformed JSON, a missing weight_map, a non-string
/// entry or a shard outside the index's folder are errors naming the file.
inline ModelIndex read_model_index(const std::filesystem::path& index) {
  nlohmann::json json;
  const std::string text = read_regular_file(index, "load_checkpoint_in_model");
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    accelerate::detail::fail("load_checkpoint_in_model: ", index.string(), " is not valid JSON (", e.what(), ")");
  }
  ACCELERATE_CHECK(json.is_object() && json.contains("weight_map") && json["weight_map"].is_object(),
                   "load_checkpoint_in_model: ", index.string(), " has no weight_map object");
  ModelIndex out;
  for (const auto& [name, file] : json["weight_map"].items()) {
    ACCELERATE_CHECK(file.is_string(), "load_checkpoint_in_model: ", index.string(), ": weight_map['", name,
                     "'] is not a file name");
    const auto shard = file.get<std::string>();
    ACCELERATE_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != ".." && shard != ".",
                     "load_checkpoint_in_model: ", index.string(), ": shard name '", shard,
                     "' must be a file in the same folder");
    out.by_file[shard].push_back(name);
  }
  if (json.contains("metadata") && json["metadata"].is_object()) {
    const auto& meta = json["metadata"];
    if (meta.contains(save_id_key) && meta[save_id_key].is_string()) out.save_id = meta[save_id_key].get<std::string>();
  }
  return out;
}

/// Reads model weights from `path` into `module` (moved to `device` first when given):
/// a .safetensors file, a model.safetensors.index.json, or a folder holding exactly one of
/// model.safetensors / a *.safetensors.index.json. Files are memory-mapped. Strict by default:
/// missing keys, unexpected keys and shape/dtype mismatches are listed in one error; an index
/// naming a missing shard is an error naming the shard.
/// Example:
///   accelerate::load_checkpoint_in_model(*net, "out/model");
inline LoadReport load_checkpoint_in_model(torch::nn::Module& module, const std::filesystem::path& path,
                                           std::optional<c10::Device> device = std::nullopt,
                                           bool strict = true) {
  namespace fs = std::filesystem;
  if (device) module.to(*device);
  const PathKind kind = path_kind(path, "load_checkpoint_in_model");
  ACCELERATE_CHECK(kind != PathKind::missing, "load_checkpoint_in_model: ", path.string(), " does not exist");
  fs::path index, single;
  if (kind == PathKind::directory) {
    std::vector<fs::path> indexes;
    for (const auto& entry : fs::directory_iterator(path))
      if (entry.path().filename().string().ends_with(".safetensors.index.json")) indexes.push_back(entry.path());
    const bool has_single = path_exists(path / "model.safetensors", "load_checkpoint_in_model");
    ACCELERATE_CHECK(indexes.size() + (has_single ? 1 : 0) == 1, "load_checkpoint_in_model: ",
                     path.string(), " must hold exactly one of model.safetensors or a "
                     "*.safetensors.index.json; found ", indexes.size(), " index file(s)",
                     has_single ? " and model.safetensors" : " and no model.safetensors");
    (indexes.empty() ? single : index) = indexes.empty() ? path / "model.safetensors" : indexes.front();
  } else if (path.string().ends_with(".index.json")) {
    index = path;
  } else {
    single = path;
  }

  std::vector<SafetensorsFile> files;
  if (!index.empty()) {
    const ModelIndex model_index = read_model_index(index);
    const std::string& save_id = model_index.save_id;
    for (const auto& [shard, names] : model_index.by_file) {
      const auto shard_path = index.parent_path() / shard;
      ACCELERATE_CHECK(path_exists(shard_path, "load_checkpoint_in_model"), "load_checkpoint_in_model: ", index.string(), " names shard ",
                       shard, " (for ", names.front(), (names.size() > 1 ? " and others" : ""),
                       ") but ", shard_path.string(), " does not exist");
      files.push_back(SafetensorsFile::open(shard_path));
      // Shards of another save under the same names (a folder mixed by hand or by a writer
      // without atomic replacement) would load silently.
      const auto& meta = files.back().metadata();
      const auto shard_id = meta.find(save_id_key);
      ACCELERATE_CHECK(save_id.empty() || (shard_id != meta.end() && shard_id->second == save_id),
                       "load_checkpoint_in_model: ", shard_path.string(), " does not belong to ", index.string(),
                       " (save id ", shard_id == meta.end() ? std::string("none") : shard_id->second,
                       ", the index has ", save_id, "): the folder mixes shards of different saves");
      for (const auto& name : names)
        ACCELERATE_CHECK(files.back().contains(name), "load_checkpoint_in_model: ", shard_path.string(),
                         " lacks tensor '", name, "' that ", index.string(), " places there");
    }
  } else {
    files.push_back(SafetensorsFile::open(single));
  }
  std::map<std::string, at::Tensor> state;
  for (const auto& file : files)
    for (const auto& name : file.names()) state.emplace(name, file.tensor(name));
  return load_named_tensors(module, state, (index.empty() ? single : index).string(), strict);
}

}  // namespace checkpoint

using checkpoint::load_checkpoint_in_model;

}  // namespace accelerate
