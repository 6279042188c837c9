// DataLoader: the unprepared description of how to batch a dataset, which prepare() turns into
// a sharded, stateful PreparedDataLoader (like passing a torch DataLoader to Accelerate).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

namespace accelerate {

/// How a dataset is batched. Per-process batch size, as Accelerate's default: with N processes
/// the global batch is N * batch_size (with AcceleratorOptions::data.split_batches,
/// batch_size is the global batch and each process gets batch_size / N of it).
/// Example:
///   accelerate::DataLoaderOptions{.batch_size = 64, .shuffle = true}
///   accelerate::DataLoaderOptions{.batch_size = 64, .shuffle = true, .num_workers = 2}
struct DataLoaderOptions {
  std::size_t batch_size = 1;
  bool shuffle = false;
  /// Drop the last incomplete round of batches instead of padding or shortening it.
  bool drop_last = false;
  /// Shuffle seed; unset means one drawn from the global torch RNG at prepare() (rank 0's
  /// draw is used everywhere), so seeding the accelerator makes the order reproducible.
  std::optional<std::uint64_t> seed;
  /// Threads that read batches ahead of the training loop (torch's num_workers). 0 reads each
  /// batch on the training thread when it is needed, and starts no thread. With workers the
  /// batches, their order and their contents are those of 0 workers, for any count, shuffled
  /// or resumed. The dataset is shared by the workers: its get() / get_batch() is called
  /// concurrently (on different indices), so it must only read shared state, or guard what it
  /// changes, and draw any randomness from the index rather than a global generator. An
  /// exception thrown by the dataset reaches the loop as accelerate::Error naming the sample.
  std::size_t num_workers = 0;
  /// Batches each worker may have ready ahead of the loop (torch's prefetch_factor): at most
  /// num_workers * prefetch_factor batches are held.
  std::size_t prefetch_factor = 2;
};

/// A dataset and its batching options, for prepare(). The dataset is map-style: it has
/// `size()` (a size_t or torch's optional<size_t>) and `get(index)`, and optionally
/// `get_batch(indices)` returning a whole batch.
/// Example:
///   auto [loader] = acc.prepare(accelerate::DataLoader(train_set, {.batch_size = 64, .shuffle = true}));
template <class Dataset>
struct DataLoader {
  std::shared_ptr<Dataset> dataset;
  DataLoaderOptions options;

  DataLoader(Dataset dataset_value, DataLoaderOptions opts = {})
      : dataset(std::make_shared<Dataset>(std::move(dataset_value))), options(opts) {}
  DataLoader(std::shared_ptr<Dataset> shared, DataLoaderOptions opts = {})
      : dataset(std::move(shared)), options(opts) {}
};

template <class Dataset>
DataLoader(Dataset, DataLoaderOptions) -> DataLoader<Dataset>;
template <class Dataset>
DataLoader(Dataset) -> DataLoader<Dataset>;
template <class Dataset>
DataLoader(std::shared_ptr<Dataset>, DataLoaderOptions) -> DataLoader<Dataset>;

}  // namespace accelerate
