// Bodies of sharding.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/checkpoint/sharding.hpp>

namespace accelerate::checkpoint {

ACCELERATE_INLINE std::uint64_t parse_size(const std::string& text) {
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

ACCELERATE_INLINE std::uint64_t shard_size_bytes(const std::variant<std::uint64_t, std::string>& size) {
  if (const auto* bytes = std::get_if<std::uint64_t>(&size)) {
    ACCELERATE_CHECK(*bytes > 0, "max_shard_size must be > 0");
    return *bytes;
  }
  return parse_size(std::get<std::string>(size));
}

ACCELERATE_INLINE std::uint64_t TensorSpec::bytes() const {
  std::uint64_t elements = 1;
  for (const int64_t d : shape) elements *= static_cast<std::uint64_t>(d);
  return elements * c10::elementSize(dtype);
}

ACCELERATE_INLINE std::vector<Shard> split_into_shards(const std::vector<TensorSpec>& specs, std::uint64_t cap,
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

ACCELERATE_INLINE std::vector<Shard> split_into_shards(const std::vector<std::pair<std::string, at::Tensor>>& state,
                                                       std::uint64_t cap, std::map<std::string, std::string>* tied) {
  std::vector<TensorSpec> specs;
  specs.reserve(state.size());
  for (const auto& [name, tensor] : state) specs.push_back(spec_of(name, tensor));
  return split_into_shards(specs, cap, tied);
}

ACCELERATE_INLINE std::string shard_file_name(std::size_t index, std::size_t count) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buffer;
}

ACCELERATE_INLINE bool is_model_file(const std::string& name) {
  if (name == "model.safetensors" || name == "model.safetensors.index.json") return true;
  const std::string_view pattern = "model-#####-of-#####.safetensors";  // '#': a digit
  if (name.size() != pattern.size()) return false;
  for (std::size_t i = 0; i < name.size(); ++i)
    if (pattern[i] == '#' ? !std::isdigit(static_cast<unsigned char>(name[i])) : name[i] != pattern[i]) return false;
  return true;
}

ACCELERATE_INLINE ModelFilesWriter::ModelFilesWriter(const std::filesystem::path& dir,
                                                     const std::vector<TensorSpec>& specs,
                                                     const SaveModelOptions& options)
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

ACCELERATE_INLINE void ModelFilesWriter::write_shard(std::size_t index,
                                                     const std::map<std::string, at::Tensor>& tensors) {
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

ACCELERATE_INLINE std::vector<std::filesystem::path> ModelFilesWriter::commit() {
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

ACCELERATE_INLINE std::vector<std::filesystem::path> write_model_files(
    const std::vector<std::pair<std::string, at::Tensor>>& state, const std::filesystem::path& dir,
    const SaveModelOptions& options) {
  std::vector<TensorSpec> specs;
  specs.reserve(state.size());
  for (const auto& [name, tensor] : state) specs.push_back(spec_of(name, tensor));
  ModelFilesWriter writer(dir, specs, options);
  const std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  for (std::size_t i = 0; i < writer.shards().size(); ++i) writer.write_shard(i, by_name);
  return writer.commit();
}

ACCELERATE_INLINE ModelIndex read_model_index(const std::filesystem::path& index) {
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

ACCELERATE_INLINE LoadReport load_checkpoint_in_model(torch::nn::Module& module, const std::filesystem::path& path,
                                                      std::optional<c10::Device> device, bool strict) {
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

}  // namespace accelerate::checkpoint
