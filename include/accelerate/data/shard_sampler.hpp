// ShardSampler: which dataset indices each rank reads in each epoch — a seeded per-epoch
// shuffle shared by all ranks, batches dealt round-robin, and Accelerate's even_batches /
// drop_last tail rules.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <accelerate/data/loader.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate::data {

/// What to shard and how. `seed` and the epoch fix the shuffle, so every rank computes the same
/// permutation without communicating (Accelerate's `use_seedable_sampler`: seed + epoch).
struct ShardSpec {
  std::size_t dataset_size = 0;
  std::size_t batch_size = 1;
  std::size_t world_size = 1;
  std::size_t rank = 0;
  bool shuffle = false;
  bool drop_last = false;
  bool even_batches = true;
  std::uint64_t seed = 0;
  /// batch_size is this rank's slice of a global batch of batch_size * world_size (the loader
  /// was given the global batch). The dealing is the same either way: rank r's slice of global
  /// batch k is batch k * world_size + r of the slice size. Recorded for checkpoints, which
  /// then compare global batches.
  bool split_batches = false;
};

/// The ShardSpec of a loader prepared with `options` over `dataset_size` samples, as rank
/// `rank` of `world_size`: its batch size per process (with `split_batches` the options give
/// the global batch, which must divide among the processes), and its shuffle seed: the
/// loader's own, else `shared_seed()`, called only when shuffling (drawing a seed consumes the
/// global generator).
/// Example:
///   auto spec = loader_shard_spec({.batch_size = 8, .shuffle = true}, 100, 2, 0, false, true, [] { return 7; });
ShardSpec loader_shard_spec(const DataLoaderOptions& options, std::size_t dataset_size, std::size_t world_size,
                            std::size_t rank, bool split_batches, bool even_batches,
                            const std::function<std::uint64_t()>& shared_seed);

/// Deals an epoch's batches to ranks: global batch g goes to rank g % world_size, so rank r's
/// k-th batch is global batch k*world_size + r. With one process that is plain batching.
///   - drop_last: only complete rounds of full batches are kept.
///   - even_batches (world > 1): the tail is completed by wrapping around to the start of the
///     epoch's order, so every rank gets the same number of full batches; remainder() tells
///     gather_for_metrics how many samples of the last round are real.
///   - neither: ranks may get different counts and a short last batch.
/// Example:
///   accelerate::data::ShardSampler s({.dataset_size = 10, .batch_size = 4, .world_size = 2, .rank = 1});
///   s.batches_per_rank();  // 2: positions 4..7, then 12..15 wrapped to 2..5 of the order
class ShardSampler {
 public:
  explicit ShardSampler(const ShardSpec& spec);

  const ShardSpec& spec() const noexcept { return spec_; }
  /// Changes the shuffle seed (restoring a saved position).
  void set_seed(std::uint64_t seed) noexcept { spec_.seed = seed; }

  /// Deals only positions `start`.. of the epoch's order (the rest of an epoch another world
  /// size began: a resume on a different number of processes); 0 deals the whole epoch.
  void set_epoch_start(std::size_t start) noexcept { start_ = std::min(start, spec_.dataset_size); }
  /// Positions of the epoch's order already dealt before this sampler's first batch.
  std::size_t epoch_start() const noexcept { return start_; }
  /// Samples this sampler deals from: the dataset, less the positions before epoch_start().
  std::size_t samples() const noexcept { return spec_.dataset_size - start_; }

  /// Number of batches this rank reads per epoch.
  std::size_t batches_per_rank() const noexcept { return batches_for(spec_.rank); }

  /// Number of batches rank `rank` reads per epoch.
  std::size_t batches_for(std::size_t rank) const noexcept;

  /// Samples of the last round that are real rather than wrapped-around padding, or 0 when the
  /// last round is all real (gather_for_metrics truncates to this on the last batch).
  std::size_t remainder() const noexcept {
    if (spec_.world_size == 1 || spec_.drop_last || !spec_.even_batches) return 0;
    return samples() % (spec_.world_size * spec_.batch_size);
  }

  /// The epoch's order of dataset indices: a permutation from a generator seeded with
  /// seed + epoch when shuffling, else 0..n-1.
  std::vector<int64_t> order(std::size_t epoch) const;

  /// Dataset indices of this rank's k-th batch, given the epoch's order (positions from
  /// epoch_start() on; the even_batches tail wraps around to epoch_start()).
  std::vector<int64_t> batch(const std::vector<int64_t>& order, std::size_t k) const;

 private:
  ShardSpec spec_;
  std::size_t start_ = 0;
};

}  // namespace accelerate::data

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/data/shard_sampler.ipp>
#endif
