// Hugging Face model files: save_model() writes model.safetensors or size-capped shards with
// model.safetensors.index.json, as Accelerate and transformers do; load_checkpoint_in_model()
// reads a file, an index or a folder back into a module, strictly by default.
#pragma once

#include <cctype>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

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
  static const std::regex pattern(R"(^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$)");
  std::smatch m;
  ACCELERATE_CHECK(std::regex_match(text, m, pattern), "max_shard_size: '", text,
                   "' is not a size such as \"1GB\", \"500MB\" or a byte count");
  std::string unit = m[2].str();
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> units = {
      {"", 1},       {"B", 1},           {"KB", 1e3},          {"MB", 1e6},          {"GB", 1e9},
      {"TB", 1e12},  {"KIB", 1024.0},    {"MIB", 1048576.0},   {"GIB", 1073741824.0},
      {"TIB", 1099511627776.0}};
  const auto it = units.find(unit);
  ACCELERATE_CHECK(it != units.end(), "max_shard_size: unknown unit '", m[2].str(), "' in '", text,
                   "' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
  const double bytes = std::stod(m[1].str()) * it->second;
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

/// huggingface_hub's split, in state-dict order without bin packing: a tensor larger than the
/// cap gets a shard of its own; otherwise a shard closes when the next tensor would overflow
/// it. Tensors sharing storage with an earlier one (tied weights) are left out and listed in
/// `tied` (name -> the name kept).
inline std::vector<Shard> split_into_shards(const std::vector<std::pair<std::string, at::Tensor>>& state,
                                            std::uint64_t cap, std::map<std::string, std::string>* tied) {
  std::vector<Shard> shards(1);
  std::map<const void*, std::string> seen_storage;
  for (const auto& [name, tensor] : state) {
    const void* storage = tensor.storage().data();
    if (storage != nullptr && tensor.numel() > 0) {
      const auto [it, inserted] = seen_storage.emplace(storage, name);
      if (!inserted) {
        if (tied) (*tied)[name] = it->second;
        continue;
      }
    }
    const auto bytes = static_cast<std::uint64_t>(tensor.numel()) * tensor.element_size();
    if (bytes > cap) {
      if (!shards.back().names.empty()) shards.emplace_back();
      shards.back().names.push_back(name);
      shards.back().bytes = bytes;
      shards.emplace_back();
      continue;
    }
    if (shards.back().bytes + bytes > cap && !shards.back().names.empty()) shards.emplace_back();
    shards.back().names.push_back(name);
    shards.back().bytes += bytes;
  }
  if (shards.back().names.empty() && shards.size() > 1) shards.pop_back();
  return shards;
}

/// "model-00002-of-00005.safetensors".
inline std::string shard_file_name(std::size_t index, std::size_t count) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buffer;
}

/// Writes a module's parameters and buffers as Hugging Face safetensors into `dir`:
/// model.safetensors, or shards plus model.safetensors.index.json ({"metadata":
/// {"total_size"}, "weight_map"}, keys sorted, 2-space indent). Stale shards of an earlier
/// save in `dir` are removed. Returns the files written. (Accelerator::save_model calls this
/// on the main process only.)
inline std::vector<std::filesystem::path> write_model_files(const torch::nn::Module& module,
                                                            const std::filesystem::path& dir,
                                                            const SaveModelOptions& options = {}) {
  ACCELERATE_CHECK(options.safe_serialization,
                   "save_model: safe_serialization=false would write a pickle (pytorch_model.bin); "
                   "accelerate-cpp never writes or reads pickle, only safetensors");
  ACCELERATE_CHECK(!std::filesystem::is_regular_file(dir), "save_model: ", dir.string(),
                   " is a file, not a folder");
  std::filesystem::create_directories(dir);
  const auto state = named_tensors(module);
  std::map<std::string, std::string> tied;
  const auto shards = split_into_shards(state, shard_size_bytes(options.max_shard_size), &tied);
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  const std::map<std::string, std::string> metadata{{"format", "pt"}};

  // Remove what an earlier save left that this one will not overwrite.
  static const std::regex stale(R"(^model-[0-9]{5}-of-[0-9]{5}\.safetensors$)");
  std::set<std::string> keep;
  for (std::size_t i = 0; i < shards.size(); ++i)
    keep.insert(shards.size() == 1 ? "model.safetensors" : shard_file_name(i, shards.size()));
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const auto name = entry.path().filename().string();
    const bool old_shard = std::regex_match(name, stale) && !keep.count(name);
    const bool old_single = shards.size() > 1 && name == "model.safetensors";
    const bool old_index = shards.size() == 1 && name == "model.safetensors.index.json";
    if (old_shard || old_single || old_index) std::filesystem::remove(entry.path());
  }

  std::vector<std::filesystem::path> written;
  nlohmann::json weight_map = nlohmann::json::object();
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const std::string file = shards.size() == 1 ? "model.safetensors" : shard_file_name(i, shards.size());
    std::map<std::string, at::Tensor> tensors;
    for (const auto& name : shards[i].names) {
      tensors.emplace(name, by_name.at(name));
      weight_map[name] = file;
    }
    total += shards[i].bytes;
    save_safetensors(dir / file, tensors, metadata);
    written.push_back(dir / file);
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    std::ofstream out(dir / "model.safetensors.index.json");
    out << index.dump(2) << '\n';
    ACCELERATE_CHECK(out.good(), "save_model: writing ", (dir / "model.safetensors.index.json").string(),
                     " failed (disk full?)");
    written.push_back(dir / "model.safetensors.index.json");
  }
  return written;
}

/// Reads a model.safetensors.index.json: tensor names grouped by shard file. Malformed JSON, a
/// missing weight_map, a non-string entry or a shard outside the index's folder are errors
/// naming the file.
inline std::map<std::string, std::vector<std::string>> read_model_index(const std::filesystem::path& index) {
  nlohmann::json json;
  try {
    std::ifstream in(index);
    ACCELERATE_CHECK(in.good(), "load_checkpoint_in_model: cannot read ", index.string());
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    accelerate::detail::fail("load_checkpoint_in_model: ", index.string(), " is not valid JSON (", e.what(), ")");
  }
  ACCELERATE_CHECK(json.is_object() && json.contains("weight_map") && json["weight_map"].is_object(),
                   "load_checkpoint_in_model: ", index.string(), " has no weight_map object");
  std::map<std::string, std::vector<std::string>> by_file;
  for (const auto& [name, file] : json["weight_map"].items()) {
    ACCELERATE_CHECK(file.is_string(), "load_checkpoint_in_model: ", index.string(), ": weight_map['", name,
                     "'] is not a file name");
    const auto shard = file.get<std::string>();
    ACCELERATE_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != ".." && shard != ".",
                     "load_checkpoint_in_model: ", index.string(), ": shard name '", shard,
                     "' must be a file in the same folder");
    by_file[shard].push_back(name);
  }
  return by_file;
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
  ACCELERATE_CHECK(fs::exists(path), "load_checkpoint_in_model: ", path.string(), " does not exist");
  fs::path index, single;
  if (fs::is_directory(path)) {
    std::vector<fs::path> indexes;
    for (const auto& entry : fs::directory_iterator(path))
      if (entry.path().filename().string().ends_with(".safetensors.index.json")) indexes.push_back(entry.path());
    const bool has_single = fs::exists(path / "model.safetensors");
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
    for (const auto& [shard, names] : read_model_index(index)) {
      const auto shard_path = index.parent_path() / shard;
      ACCELERATE_CHECK(fs::exists(shard_path), "load_checkpoint_in_model: ", index.string(), " names shard ",
                       shard, " (for ", names.front(), (names.size() > 1 ? " and others" : ""),
                       ") but ", shard_path.string(), " does not exist");
      files.push_back(SafetensorsFile::open(shard_path));
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
