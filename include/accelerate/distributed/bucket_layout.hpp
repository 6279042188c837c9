// BucketLayout: which parameters share a gradient bucket and where each one sits in it. Pure
// bookkeeping (no tensors, no collectives), so the assignment, the rebuild in arrival order and
// the slices a sharded bucket gives each rank are testable without processes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <accelerate/detail/linkage.hpp>

namespace accelerate::distributed {

/// What bucket assignment knows of one parameter.
struct BucketedParameter {
  int64_t numel = 0;
  std::size_t element_size = 4;
  /// Parameters share a bucket only when they have the same kind: (device type, device index,
  /// dtype), as integers.
  std::tuple<int, int, int> kind{};
  /// A bucket never holds parameters of two units (ZeRO-3 gathers a unit's buckets alone);
  /// every parameter in unit 0 when there are none.
  std::size_t unit = 0;
};

/// One bucket: its parameters (indices) in the order they sit in its flat buffer, where each
/// starts, and its length, padded.
struct LaidOutBucket {
  std::vector<std::size_t> params;
  std::vector<int64_t> offsets;
  /// Elements of its parameters.
  int64_t length = 0;
  /// `length` rounded up to a multiple of BucketLayout's pad_to (the world size when each rank
  /// gets an equal slice of it).
  int64_t padded = 0;
};

/// Bucket assignment, as PyTorch DDP's: parameters are taken in a given order (initially the
/// reverse of registration, roughly the order backward produces gradients) into one open bucket
/// per kind, closed once it holds `bucket_cap_bytes` (`first_bucket_cap_bytes` for the first
/// bucket, small so that the first communication starts early).
/// Example:
///   BucketLayout layout({{1000, 4}, {10, 4}}, 1 << 20, 4 << 20, /*pad_to=*/2);
///   layout.bucket_of(1);            // 0: both fit the first bucket, parameter 1 first
///   layout.lay_out({0, 1});         // rebuilt in another order (arrival)
class BucketLayout {
 public:
  BucketLayout() = default;
  BucketLayout(std::vector<BucketedParameter> params, std::size_t first_bucket_cap_bytes,
               std::size_t bucket_cap_bytes, int64_t pad_to);

  /// Lays the buckets out again, taking the parameters in `order` (each exactly once).
  void lay_out(const std::vector<std::size_t>& order);

  std::size_t size() const noexcept { return buckets_.size(); }
  const LaidOutBucket& operator[](std::size_t bucket) const { return buckets_[bucket]; }
  const std::vector<LaidOutBucket>& buckets() const noexcept { return buckets_; }
  std::size_t parameter_count() const noexcept { return params_.size(); }

  /// Parameter `index`'s bucket, its position there, and the element it starts at.
  std::size_t bucket_of(std::size_t index) const { return bucket_of_.at(index); }
  std::size_t position_of(std::size_t index) const { return position_of_.at(index); }
  int64_t offset_of(std::size_t index) const { return buckets_[bucket_of(index)].offsets[position_of_[index]]; }

  /// The reverse of registration order: where the layout starts.
  std::vector<std::size_t> initial_order() const;
  /// The parameters bucket by bucket, in launch order.
  std::vector<std::size_t> launch_order() const;
  /// `order` as parameter indices when it names every parameter exactly once, else nothing
  /// (an order received from another rank or read from a checkpoint is checked with it).
  std::optional<std::vector<std::size_t>> order_from(const std::vector<int64_t>& order) const;

  /// Elements of bucket `bucket` each of `world` ranks holds when it is cut in equal slices.
  int64_t slice_length(std::size_t bucket, int world) const { return buckets_.at(bucket).padded / world; }
  /// The elements [first, second) of parameter `index`, flattened, that rank `rank` of `world`
  /// holds (first == second: none). One parameter's slices are contiguous and in rank order.
  std::pair<int64_t, int64_t> held_by(std::size_t index, int rank, int world) const;

 private:
  std::vector<BucketedParameter> params_;
  std::size_t first_cap_ = 0, cap_ = 0;
  int64_t pad_to_ = 1;
  std::vector<LaidOutBucket> buckets_;
  std::vector<std::size_t> bucket_of_;    // parameter -> bucket
  std::vector<std::size_t> position_of_;  // parameter -> position in its bucket
};

}  // namespace accelerate::distributed

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/distributed/bucket_layout.ipp>
#endif
