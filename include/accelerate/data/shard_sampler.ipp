// Bodies of shard_sampler.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/data/shard_sampler.hpp>

namespace accelerate::data {

ACCELERATE_INLINE ShardSpec loader_shard_spec(const DataLoaderOptions& options, std::size_t dataset_size,
                                              std::size_t world_size, std::size_t rank, bool split_batches,
                                              bool even_batches, const std::function<std::uint64_t()>& shared_seed) {
  ShardSpec spec;
  spec.dataset_size = dataset_size;
  spec.batch_size = options.batch_size;
  spec.world_size = world_size;
  ACCELERATE_CHECK(spec.batch_size > 0, "prepare: DataLoaderOptions::batch_size must be > 0");
  if (split_batches) {
    ACCELERATE_CHECK(spec.batch_size % spec.world_size == 0, "prepare: with data.split_batches the batch_size ",
                     spec.batch_size, " is the global batch and must divide between the ", spec.world_size,
                     " processes");
    spec.batch_size /= spec.world_size;
    spec.split_batches = true;
  }
  spec.rank = rank;
  spec.shuffle = options.shuffle;
  spec.drop_last = options.drop_last;
  spec.even_batches = even_batches;
  spec.seed = options.seed ? *options.seed : spec.shuffle ? shared_seed() : 0;
  return spec;
}

ACCELERATE_INLINE ShardSampler::ShardSampler(const ShardSpec& spec)
    : spec_(spec) {
  ACCELERATE_CHECK(spec.batch_size > 0, "ShardSampler: batch_size must be > 0");
  ACCELERATE_CHECK(spec.world_size > 0 && spec.rank < spec.world_size,
                   "ShardSampler: rank ", spec.rank, " is outside world_size ", spec.world_size);
}

ACCELERATE_INLINE std::size_t ShardSampler::batches_for(std::size_t rank) const noexcept {
  const std::size_t n = samples(), b = spec_.batch_size, w = spec_.world_size;
  if (n == 0) return 0;
  const std::size_t full = n / b;
  if (spec_.drop_last) return full / w;
  const std::size_t total = full + (n % b != 0 ? 1 : 0);
  if (w == 1) return total;
  if (spec_.even_batches) return (n + w * b - 1) / (w * b);
  return total / w + (rank < total % w ? 1 : 0);
}

ACCELERATE_INLINE std::vector<int64_t> ShardSampler::order(std::size_t epoch) const {
  const auto n = static_cast<int64_t>(spec_.dataset_size);
  std::vector<int64_t> out(static_cast<std::size_t>(n));
  if (!spec_.shuffle) {
    for (int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = i;
    return out;
  }
  auto generator = at::make_generator<at::CPUGeneratorImpl>(spec_.seed + epoch);
  const at::Tensor perm = at::randperm(n, generator, at::TensorOptions().dtype(at::kLong));
  std::copy_n(perm.data_ptr<int64_t>(), n, out.begin());
  return out;
}

ACCELERATE_INLINE std::vector<int64_t> ShardSampler::batch(const std::vector<int64_t>& order, std::size_t k) const {
  const std::size_t skipped = std::min(start_, order.size());
  const std::size_t n = order.size() - skipped, b = spec_.batch_size;
  const std::size_t global = k * spec_.world_size + spec_.rank;
  const std::size_t begin = global * b;
  const bool wrap = spec_.world_size > 1 && spec_.even_batches && !spec_.drop_last;
  const std::size_t end = wrap ? begin + b : std::min(begin + b, n);
  std::vector<int64_t> out;
  out.reserve(end > begin ? end - begin : 0);
  for (std::size_t p = begin; p < end; ++p) out.push_back(order[skipped + (p < n ? p : (p - n) % n)]);
  return out;
}

}  // namespace accelerate::data
