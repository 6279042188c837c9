// Bodies of bucket_reduction.hpp (see detail/linkage.hpp).
#pragma once

#include <algorithm>

#include <torch/csrc/autograd/grad_mode.h>

#include <accelerate/detail/check.hpp>
#include <accelerate/distributed/bucket_reduction.hpp>

namespace accelerate::distributed {

ACCELERATE_INLINE void BucketReduction::wait_ignoring_errors(const InFlight& work) noexcept {
  try {
    if (work) work.work->wait();
  } catch (...) {
  }
}

ACCELERATE_INLINE void BucketReduction::wait_quietly(std::vector<BucketBuffers>& buckets, std::size_t launched) {
  for (std::size_t b = 0; b < launched && b < buckets.size(); ++b)
    wait_ignoring_errors(buckets[b].work);  // none when retired already
}

ACCELERATE_INLINE void BucketReduction::reset_round(std::vector<BucketBuffers>& buckets) {
  for (auto& bucket : buckets) bucket.work.reset();
}

ACCELERATE_INLINE void BucketReduction::check_state(std::size_t bucket,
                                                    const std::map<std::string, at::Tensor>& saved) const {
  for (const auto& entry : saved)
    accelerate::detail::fail("gradient sync state: unexpected entry '", entry.first, "' for bucket ", bucket,
                             ": this job's gradients are summed by ", name(), ", which keeps no state");
}

// --- AllReduceSum ----------------------------------------------------------------------------

ACCELERATE_INLINE void AllReduceSum::launch(std::vector<BucketBuffers>& buckets, std::size_t bucket) {
  buckets[bucket].work = comm_->all_reduce_async(buckets[bucket].flat);
}

ACCELERATE_INLINE void AllReduceSum::finish(std::vector<BucketBuffers>& buckets, int divisor) {
  torch::NoGradGuard no_grad;
  for (auto& bucket : buckets) {
    if (bucket.work) comm_->wait(bucket.work, "gradient all_reduce");
    bucket.flat.div_(divisor);
  }
}

// --- RankOrderedSum --------------------------------------------------------------------------

ACCELERATE_INLINE void RankOrderedSum::lay_out(const BucketLayout&, const std::vector<std::vector<int64_t>>&,
                                               const std::vector<BucketBuffers>& buckets) {
  exchange_.assign(buckets.size(), {});
}

ACCELERATE_INLINE void RankOrderedSum::launch(std::vector<BucketBuffers>& buckets, std::size_t bucket) {
  buckets[bucket].work = comm_->gradient_sum_scatter_async(buckets[bucket].flat);
  launched_ = bucket + 1;
  start_exchanges(buckets, /*wait=*/false);
}

ACCELERATE_INLINE void RankOrderedSum::start_exchanges(std::vector<BucketBuffers>& buckets, bool wait) {
  for (; next_exchange_ < launched_; ++next_exchange_) {
    BucketBuffers& bucket = buckets[next_exchange_];
    if (!wait && !Communicator::done(bucket.work)) return;
    comm_->wait(bucket.work, "gradient all_reduce (reduce-scatter)");
    bucket.work.reset();
    const int tag = kGradientSumTag + static_cast<int>(next_exchange_);
    exchange_[next_exchange_] = comm_->gradient_sum_gather_async(bucket.flat, tag);
  }
}

ACCELERATE_INLINE void RankOrderedSum::finish(std::vector<BucketBuffers>& buckets, int divisor) {
  start_exchanges(buckets, /*wait=*/true);
  torch::NoGradGuard no_grad;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    for (const auto& part : exchange_[b]) comm_->wait(part, "gradient all_reduce (slice exchange)");
    exchange_[b].clear();
    if (buckets[b].work) comm_->wait(buckets[b].work, "gradient all_reduce");
    buckets[b].flat.div_(divisor);
  }
}

ACCELERATE_INLINE void RankOrderedSum::wait_quietly(std::vector<BucketBuffers>& buckets, std::size_t launched) {
  BucketReduction::wait_quietly(buckets, launched);
  for (std::size_t b = 0; b < launched && b < exchange_.size(); ++b)
    for (const auto& part : exchange_[b]) wait_ignoring_errors(part);
}

ACCELERATE_INLINE void RankOrderedSum::reset_round(std::vector<BucketBuffers>& buckets) {
  BucketReduction::reset_round(buckets);
  for (auto& parts : exchange_) parts.clear();
  launched_ = 0;
  next_exchange_ = 0;
}

// --- CompressedSum ---------------------------------------------------------------------------

ACCELERATE_INLINE void CompressedSum::lay_out(const BucketLayout& layout,
                                              const std::vector<std::vector<int64_t>>& shapes,
                                              const std::vector<BucketBuffers>& buckets) {
  uncompressed_->lay_out(layout, shapes, buckets);
  compressors_.clear();
  for (const LaidOutBucket& bucket : layout.buckets()) {
    std::vector<BucketEntry> entries;
    for (std::size_t j = 0; j < bucket.params.size(); ++j) entries.push_back({bucket.offsets[j], shapes.at(bucket.params[j])});
    compressors_.emplace_back(kind_, power_sgd_, std::move(entries));
  }
  second_.assign(compressors_.size(), at::Tensor());
  second_work_.assign(compressors_.size(), InFlight{});
}

ACCELERATE_INLINE void CompressedSum::open_round(std::size_t rounds) {
  compressed_ = kind_ != GradientCompression::power_sgd || rounds >= power_sgd_.start_iteration;
  if (!compressed_) uncompressed_->open_round(rounds);
}

ACCELERATE_INLINE void CompressedSum::launch(std::vector<BucketBuffers>& buckets, std::size_t bucket) {
  if (!compressed_) return uncompressed_->launch(buckets, bucket);
  at::Tensor wire = compressors_[bucket].compress(buckets[bucket].flat, comm_->world_size());
  buckets[bucket].work = comm_->all_reduce_async(wire);
}

ACCELERATE_INLINE void CompressedSum::finish(std::vector<BucketBuffers>& buckets, int divisor) {
  if (!compressed_) return uncompressed_->finish(buckets, divisor);
  torch::NoGradGuard no_grad;
  // The average comes back; PowerSGD's second factor is summed next, each bucket's launched
  // before the next bucket is waited for.
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    if (buckets[b].work) comm_->wait(buckets[b].work, "gradient all_reduce");
    second_[b] = compressors_[b].decompress(buckets[b].flat, divisor);
    if (second_[b].defined()) second_work_[b] = comm_->all_reduce_async(second_[b]);
  }
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    if (!second_work_[b]) continue;
    comm_->wait(second_work_[b], "gradient all_reduce (PowerSGD's second factor)");
    compressors_[b].finish(buckets[b].flat, divisor);
  }
}

ACCELERATE_INLINE void CompressedSum::wait_quietly(std::vector<BucketBuffers>& buckets, std::size_t launched) {
  if (!compressed_) return uncompressed_->wait_quietly(buckets, launched);
  BucketReduction::wait_quietly(buckets, launched);
  for (const auto& work : second_work_) wait_ignoring_errors(work);
}

ACCELERATE_INLINE void CompressedSum::reset_round(std::vector<BucketBuffers>& buckets) {
  uncompressed_->reset_round(buckets);
  for (auto& work : second_work_) work.reset();
  for (auto& second : second_) second = at::Tensor();
}

ACCELERATE_INLINE std::size_t CompressedSum::state_bytes() const noexcept {
  std::size_t total = 0;
  for (const auto& compressor : compressors_) total += compressor.state_bytes();
  return total;
}

// --- ScatteredSum ----------------------------------------------------------------------------

ACCELERATE_INLINE void ScatteredSum::launch(std::vector<BucketBuffers>& buckets, std::size_t bucket) {
  buckets[bucket].work = comm_->reduce_scatter_async(buckets[bucket].flat, buckets[bucket].shard);
  ++in_flight_;
  if (bucket >= limit_) retire(buckets[bucket - limit_]);
  peak_ = std::max(peak_, in_flight_);
}

ACCELERATE_INLINE void ScatteredSum::retire(BucketBuffers& bucket) {
  if (!bucket.work) return;
  comm_->wait(bucket.work, "gradient reduce_scatter");
  bucket.work.reset();
  --in_flight_;
  bucket.flat.reset();
}

ACCELERATE_INLINE void ScatteredSum::finish(std::vector<BucketBuffers>& buckets, int divisor) {
  torch::NoGradGuard no_grad;
  for (auto& bucket : buckets) {
    retire(bucket);  // the full buffer lives for one round at most
    bucket.shard.div_(divisor);
  }
}

ACCELERATE_INLINE void ScatteredSum::reset_round(std::vector<BucketBuffers>& buckets) {
  BucketReduction::reset_round(buckets);
  in_flight_ = 0;
  for (auto& bucket : buckets) bucket.flat.reset();
}

// --- the choice ------------------------------------------------------------------------------

ACCELERATE_INLINE std::unique_ptr<BucketReduction> make_bucket_reduction(const std::shared_ptr<Communicator>& comm,
                                                                         bool scatters, const DdpOptions& ddp) {
  if (scatters) return std::make_unique<ScatteredSum>(comm, ddp.sharded_buckets_in_flight);
  // Two ranks add a + b whatever the order, so the two collectives buy nothing there.
  const bool rank_ordered = ddp.sum_in_rank_order && comm->world_size() > 2 && comm->sums_in_rank_order();
  std::unique_ptr<BucketReduction> sum;
  if (rank_ordered) sum = std::make_unique<RankOrderedSum>(comm);
  else sum = std::make_unique<AllReduceSum>(comm);
  if (ddp.compression != GradientCompression::none)
    sum = std::make_unique<CompressedSum>(comm, ddp.compression, ddp.power_sgd, std::move(sum));
  return sum;
}

}  // namespace accelerate::distributed
