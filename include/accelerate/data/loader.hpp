// DataLoader: the unprepared description of how to batch a dataset, which prepare() turns into
// a sharded, stateful PreparedDataLoader (like passing a torch DataLoader to Accelerate).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

namespace accelerate {

/// How a dataset is batched. Per-process batch size, as Accelerate's default
/// (split_batches=false): with N processes the global batch is N * batch_size.
/// Example:
///   accelerate::DataLoaderOptions{.batch_size = 64, .shuffle = true}
struct DataLoaderOptions {
  std::size_t batch_size = 1;
  bool shuffle = false;
  /// Drop the last incomplete round of batches instead of padding or shortening it.
  bool drop_last = false;
  /// Shuffle seed; unset means one drawn from the global torch RNG at prepare() (rank 0's
  /// draw is used everywhere), so seeding the accelerator makes the order reproducible.
  std::optional<std::uint64_t> seed;
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
