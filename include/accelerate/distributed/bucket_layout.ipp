// Bodies of bucket_layout.hpp (see detail/linkage.hpp).
#pragma once

#include <algorithm>
#include <map>

#include <accelerate/detail/check.hpp>
#include <accelerate/distributed/bucket_layout.hpp>

namespace accelerate::distributed {

ACCELERATE_INLINE BucketLayout::BucketLayout(std::vector<BucketedParameter> params, std::size_t first_bucket_cap_bytes,
                                             std::size_t bucket_cap_bytes, int64_t pad_to)
    : params_(std::move(params)), first_cap_(first_bucket_cap_bytes), cap_(bucket_cap_bytes), pad_to_(pad_to) {
  ACCELERATE_CHECK(pad_to_ >= 1, "BucketLayout: pad_to must be at least 1, got ", pad_to_);
  lay_out(initial_order());
}

ACCELERATE_INLINE void BucketLayout::lay_out(const std::vector<std::size_t>& order) {
  std::map<std::tuple<int, int, int>, std::size_t> open;  // the open bucket of each kind
  std::vector<LaidOutBucket> buckets;
  std::vector<std::size_t> bytes;
  bucket_of_.assign(params_.size(), 0);
  position_of_.assign(params_.size(), 0);
  std::size_t unit = order.empty() ? 0 : params_.at(order.front()).unit;
  for (const std::size_t k : order) {
    const BucketedParameter& p = params_.at(k);
    if (p.unit != unit) {  // a unit's buckets are its own
      open.clear();
      unit = p.unit;
    }
    auto it = open.find(p.kind);
    if (it == open.end()) {
      buckets.emplace_back();
      bytes.push_back(0);
      it = open.emplace(p.kind, buckets.size() - 1).first;
    }
    LaidOutBucket& bucket = buckets[it->second];
    position_of_[k] = bucket.params.size();
    bucket_of_[k] = it->second;
    bucket.offsets.push_back(bucket.length);
    bucket.params.push_back(k);
    bucket.length += p.numel;
    bytes[it->second] += static_cast<std::size_t>(p.numel) * p.element_size;
    if (bytes[it->second] >= (it->second == 0 ? first_cap_ : cap_)) open.erase(it);  // full: the next opens anew
  }
  for (auto& bucket : buckets) bucket.padded = (bucket.length + pad_to_ - 1) / pad_to_ * pad_to_;
  buckets_ = std::move(buckets);
}

ACCELERATE_INLINE std::vector<std::size_t> BucketLayout::initial_order() const {
  std::vector<std::size_t> reverse(params_.size());
  for (std::size_t k = 0; k < reverse.size(); ++k) reverse[k] = reverse.size() - 1 - k;
  return reverse;
}

ACCELERATE_INLINE std::vector<std::size_t> BucketLayout::launch_order() const {
  std::vector<std::size_t> order;
  for (const auto& bucket : buckets_) order.insert(order.end(), bucket.params.begin(), bucket.params.end());
  return order;
}

ACCELERATE_INLINE std::optional<std::vector<std::size_t>> BucketLayout::order_from(
    const std::vector<int64_t>& order) const {
  if (order.size() != params_.size()) return std::nullopt;
  std::vector<bool> seen(params_.size(), false);
  std::vector<std::size_t> indices;
  indices.reserve(order.size());
  for (const int64_t index : order) {
    if (index < 0 || index >= static_cast<int64_t>(params_.size()) || seen[static_cast<std::size_t>(index)])
      return std::nullopt;
    seen[static_cast<std::size_t>(index)] = true;
    indices.push_back(static_cast<std::size_t>(index));
  }
  return indices;
}

ACCELERATE_INLINE std::pair<int64_t, int64_t> BucketLayout::held_by(std::size_t index, int rank, int world) const {
  const int64_t length = slice_length(bucket_of(index), world);
  const int64_t offset = offset_of(index);
  const int64_t numel = params_[index].numel;
  const int64_t begin = std::clamp<int64_t>(rank * length - offset, 0, numel);
  const int64_t end = std::clamp<int64_t>((rank + 1) * length - offset, 0, numel);
  return {begin, std::max(begin, end)};
}

}  // namespace accelerate::distributed
