// Sharded state in checkpoints: the manifest a rank writes beside its slices (which flat range
// of which parameter it holds), the checks a load makes against it, and re-cutting the slices
// every saved rank held into the layout of another number of processes, stage or bucket size.
// No process group is involved: the sharded engines (distributed/sharded.hpp) build the
// manifests and call these when they load, and tests call them directly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <accelerate/checkpoint/registry.hpp>
#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate::checkpoint {

/// One slice a rank holds: elements [offset, offset + numel) of a flattened parameter of
/// global `shape`. An optimizer's slices name their model and their index in the optimizer's
/// state ("state.<index>.<field>"); a model's slices name neither.
struct ShardRecord {
  std::string model;  // empty: the model's own manifest
  std::string parameter;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t numel = 0;
  std::optional<int64_t> index;
};

/// The manifest written under "shards": {"stage", "world_size", "rank", "pieces": [...]}.
/// Example:
///   auto manifest = shard_manifest(2, world, rank, {{"model", "fc.weight", {4, 3}, 0, 6, 0}});
nlohmann::json shard_manifest(int stage, int world_size, int rank, const std::vector<ShardRecord>& pieces);

/// A saved optimizer shard's manifest against this rank's (`expected`): same stage, world
/// size, rank and slices, or an error naming the first difference.
void check_optimizer_manifest(const nlohmann::json& expected, const StateDict& saved);

/// Whether a state saved by the same number of processes was cut otherwise than `mine` (another
/// stage, bucket size or model): load_state re-cuts it from every saved rank's slices, as for
/// another number of processes, rather than refusing at one world size what it re-cuts at another.
bool cut_otherwise(const nlohmann::json& mine, const StateDict& saved);

/// This rank's optimizer state in the layout `mine` describes, assembled from the slices every
/// saved rank held: each state tensor of each of this rank's slices is copied together from
/// the saved slices of the same parameter that overlap it; step counts and hyperparameters are
/// the saved ones. `optimizer` is this rank's (its param groups hold the slices of `mine`).
StateDict resharded_optimizer_state(const nlohmann::json& mine, const torch::optim::Optimizer& optimizer,
                                    const std::vector<StateDict>& saved);

/// Stage 3: this rank's parameter slices (as `mine` lists them) copied together from the
/// saved ranks' slices that overlap them; buffers and frozen parameters from saved rank 0.
StateDict resharded_model_state(const nlohmann::json& mine, const std::vector<StateDict>& saved);

/// Stage 3 in one process: the model entry of a world of one, whose rank holds every
/// trainable parameter whole (shape kept, offset 0), under the same manifest as several
/// processes write. So a checkpoint moves between one process and several both ways:
/// resharded_model_state re-cuts either into the other, bit for bit.
Entry whole_sharded_model_entry(const torch::nn::Module& module, int stage);

/// A saved slice of a flattened parameter: elements [offset, offset + numel), in `tensor`.
struct SavedSlice {
  int64_t offset;
  int64_t numel;
  at::Tensor tensor;
};

/// Elements [begin, begin + numel) of a flattened parameter, copied together from the saved
/// `slices` that overlap them; an error naming `what` unless they cover every element.
at::Tensor assembled_slice(int64_t begin, int64_t numel, const std::vector<SavedSlice>& slices,
                           const std::string& what);

}  // namespace accelerate::checkpoint

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/checkpoint/shard_manifest.ipp>
#endif
