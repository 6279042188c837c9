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
#include <accelerate/detail/linkage.hpp>

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
std::uint64_t parse_size(const std::string& text);

std::uint64_t shard_size_bytes(const std::variant<std::uint64_t, std::string>& size);

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

  std::uint64_t bytes() const;
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
std::vector<Shard> split_into_shards(const std::vector<TensorSpec>& specs, std::uint64_t cap,
                                     std::map<std::string, std::string>* tied);

/// The same for tensors one holds (tied: sharing storage with an earlier one).
std::vector<Shard> split_into_shards(const std::vector<std::pair<std::string, at::Tensor>>& state,
                                     std::uint64_t cap, std::map<std::string, std::string>* tied);

/// "model-00002-of-00005.safetensors".
std::string shard_file_name(std::size_t index, std::size_t count);

/// Whether `name` is a file save_model writes (and so replaces): model.safetensors, its index,
/// or a shard "model-NNNNN-of-NNNNN.safetensors".
bool is_model_file(const std::string& name);

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
                   const SaveModelOptions& options = {});
  ModelFilesWriter(const ModelFilesWriter&) = delete;
  ModelFilesWriter& operator=(const ModelFilesWriter&) = delete;
  ~ModelFilesWriter() { if (!committed_) discard(); }

  /// The files' plan: each shard's tensor names (state-dict order, tied copies left out).
  const std::vector<Shard>& shards() const noexcept { return shards_; }
  /// Tied names left out of the files (name -> the name written).
  const std::map<std::string, std::string>& tied() const noexcept { return tied_; }

  /// Writes shard `index` (shards are written in order) from `tensors`, which must hold
  /// exactly its names with the planned shapes and dtypes; the file is fsynced.
  void write_shard(std::size_t index, const std::map<std::string, at::Tensor>& tensors);

  /// Writes the index (several shards) and puts the folder in place. Returns the files.
  std::vector<std::filesystem::path> commit();

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
std::vector<std::filesystem::path> write_model_files(
    const std::vector<std::pair<std::string, at::Tensor>>& state, const std::filesystem::path& dir,
    const SaveModelOptions& options = {});

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
ModelIndex read_model_index(const std::filesystem::path& index);

/// Reads model weights from `path` into `module` (moved to `device` first when given):
/// a .safetensors file, a model.safetensors.index.json, or a folder holding exactly one of
/// model.safetensors / a *.safetensors.index.json. Files are memory-mapped. Strict by default:
/// missing keys, unexpected keys and shape/dtype mismatches are listed in one error; an index
/// naming a missing shard is an error naming the shard.
/// Example:
///   accelerate::load_checkpoint_in_model(*net, "out/model");
LoadReport load_checkpoint_in_model(torch::nn::Module& module, const std::filesystem::path& path,
                                    std::optional<c10::Device> device = std::nullopt,
                                    bool strict = true);

}  // namespace checkpoint

using checkpoint::load_checkpoint_in_model;

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/checkpoint/sharding.ipp>
#endif
