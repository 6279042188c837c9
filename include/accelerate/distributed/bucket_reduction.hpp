// BucketReduction: how a reducer's gradient buckets are summed across ranks and become the
// average, chosen once when a model is prepared (make_bucket_reduction). The reducer fills the
// buckets from backward's hooks and launches each one as soon as it is full; the reduction
// decides which collectives carry it and what is left on this rank afterwards.
//
// A new way to reduce (a hierarchical sum, a reproducible one) is a class deriving from
// BucketReduction here and one line in make_bucket_reduction.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <accelerate/detail/linkage.hpp>
#include <accelerate/distributed/bucket_layout.hpp>
#include <accelerate/distributed/communicator.hpp>
#include <accelerate/distributed/compression.hpp>
#include <accelerate/options.hpp>

namespace accelerate::distributed {

/// One bucket's buffers while its gradients are summed: the reducer fills `flat`, the
/// reduction sums it.
struct BucketBuffers {
  /// This rank's gradients (padded); a replicated reduction leaves the average in it.
  at::Tensor flat;
  /// A scattering reduction's result: this rank's slice of the average.
  at::Tensor shard;
  /// The bucket's dtype and device.
  at::TensorOptions options;
  /// Its collective in flight.
  InFlight work;
};

/// How every bucket of a round is summed. Every rank holds the same kind of reduction and
/// calls it identically (launch in bucket order, then finish), so their collectives pair.
class BucketReduction {
 public:
  virtual ~BucketReduction() = default;

  /// Its name in messages ("all_reduce", "rank_ordered_sum", "compressed (powersgd)",
  /// "reduce_scatter").
  virtual std::string name() const = 0;
  /// Whether each rank keeps only its slice of the average (BucketBuffers::shard, of
  /// BucketLayout::slice_length elements) instead of the whole bucket.
  virtual bool scatters() const noexcept { return false; }
  /// Whether buckets must be padded to a multiple of the world size.
  virtual bool pads() const noexcept { return scatters(); }
  /// Whether each element's values are added in rank order (RankOrderedSum).
  virtual bool sums_in_rank_order() const noexcept { return false; }

  /// The buckets were laid out (at construction, and again when rebuilt): what it keeps per
  /// bucket follows. `shapes` are the parameters' shapes.
  virtual void lay_out(const BucketLayout& layout, const std::vector<std::vector<int64_t>>& shapes,
                       const std::vector<BucketBuffers>& buckets) {
    (void)layout, (void)shapes, (void)buckets;
  }
  /// A synchronised round opens after `rounds` earlier ones.
  virtual void open_round(std::size_t rounds) { (void)rounds; }
  /// Starts summing bucket `bucket`, whose `flat` holds this rank's gradients now; buckets are
  /// launched in order, from backward's hooks.
  virtual void launch(std::vector<BucketBuffers>& buckets, std::size_t bucket) = 0;
  /// Once every bucket was launched: waits for them and leaves each one's average over
  /// `divisor` ranks (in `flat`, or in `shard` when it scatters).
  virtual void finish(std::vector<BucketBuffers>& buckets, int divisor) = 0;
  /// Waits for what buckets [0, launched) started, ignoring errors: a round given up must
  /// leave nothing in flight for the next round's collectives to pair with.
  virtual void wait_quietly(std::vector<BucketBuffers>& buckets, std::size_t launched);
  /// Forgets the round (after finish, or after wait_quietly).
  virtual void reset_round(std::vector<BucketBuffers>& buckets);

  /// State kept between rounds that a checkpoint carries, for bucket `bucket` (compression).
  virtual std::map<std::string, at::Tensor> state(std::size_t bucket) const {
    (void)bucket;
    return {};
  }
  /// Finds what load_state would refuse, changing nothing (by default: any entry).
  virtual void check_state(std::size_t bucket, const std::map<std::string, at::Tensor>& saved) const;
  /// Restores state(); `keep` false (saved by another number of processes) starts afresh.
  virtual void load_state(std::size_t bucket, const std::map<std::string, at::Tensor>& saved,
                          const at::TensorOptions& options, bool keep) {
    (void)bucket, (void)saved, (void)options, (void)keep;
  }
  /// Bytes it keeps between rounds.
  virtual std::size_t state_bytes() const noexcept { return 0; }

 protected:
  /// Waits for `work`, if any, and drops its error: wait_quietly's step for each collective it
  /// started (the round is given up, so the error that matters was raised already).
  static void wait_ignoring_errors(const InFlight& work) noexcept;
};

/// The sum by one all-reduce per bucket (PyTorch DDP's), then a division.
class AllReduceSum : public BucketReduction {
 public:
  explicit AllReduceSum(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  std::string name() const override { return "all_reduce"; }
  void launch(std::vector<BucketBuffers>& buckets, std::size_t bucket) override;
  void finish(std::vector<BucketBuffers>& buckets, int divisor) override;

 private:
  std::shared_ptr<Communicator> comm_;
};

/// The sum with each element's values added in rank order, whatever the topology (Gloo's
/// all-reduce adds them in an order that depends on the element's position, so 3 or more
/// ranks would not sum as PyTorch DDP's 2 do): each padded bucket is reduce-scattered as an
/// all-to-all whose receiver adds the slices in rank order, then the summed slices are
/// exchanged point to point, started as soon as a launch finds a reduce-scatter done (else in
/// finish), so both halves overlap backward as the all-reduce did.
class RankOrderedSum : public BucketReduction {
 public:
  explicit RankOrderedSum(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  std::string name() const override { return "rank_ordered_sum"; }
  bool pads() const noexcept override { return true; }
  bool sums_in_rank_order() const noexcept override { return true; }
  void lay_out(const BucketLayout& layout, const std::vector<std::vector<int64_t>>& shapes,
               const std::vector<BucketBuffers>& buckets) override;
  void launch(std::vector<BucketBuffers>& buckets, std::size_t bucket) override;
  void finish(std::vector<BucketBuffers>& buckets, int divisor) override;
  void wait_quietly(std::vector<BucketBuffers>& buckets, std::size_t launched) override;
  void reset_round(std::vector<BucketBuffers>& buckets) override;

 private:
  // Starts the exchange of each launched bucket whose reduce-scatter is done, in launch order;
  // with `wait`, of every launched bucket. Point to point, matched by tag, so ranks may start
  // them at different moments.
  void start_exchanges(std::vector<BucketBuffers>& buckets, bool wait);

  // One tag per bucket (nothing else sends point to point while gradients synchronise).
  static constexpr int kGradientSumTag = 1 << 20;
  std::shared_ptr<Communicator> comm_;
  std::vector<std::vector<InFlight>> exchange_;  // per bucket: its summed slice's sends and receives
  std::size_t launched_ = 0;
  std::size_t next_exchange_ = 0;
};

/// The sum of what BucketCompressor makes of each bucket (fp16, bf16, PowerSGD), decompressed
/// into the bucket; PowerSGD's second factor is summed after the first. Rounds before PowerSGD's
/// start_iteration are summed uncompressed, by `uncompressed`.
class CompressedSum : public BucketReduction {
 public:
  CompressedSum(std::shared_ptr<Communicator> comm, GradientCompression kind, PowerSgdOptions power_sgd,
                std::unique_ptr<BucketReduction> uncompressed)
      : comm_(std::move(comm)), kind_(kind), power_sgd_(power_sgd), uncompressed_(std::move(uncompressed)) {}
  std::string name() const override { return std::string("compressed (") + to_string(kind_) + ")"; }
  bool pads() const noexcept override { return uncompressed_->pads(); }
  bool sums_in_rank_order() const noexcept override { return uncompressed_->sums_in_rank_order(); }
  void lay_out(const BucketLayout& layout, const std::vector<std::vector<int64_t>>& shapes,
               const std::vector<BucketBuffers>& buckets) override;
  void open_round(std::size_t rounds) override;
  void launch(std::vector<BucketBuffers>& buckets, std::size_t bucket) override;
  void finish(std::vector<BucketBuffers>& buckets, int divisor) override;
  void wait_quietly(std::vector<BucketBuffers>& buckets, std::size_t launched) override;
  void reset_round(std::vector<BucketBuffers>& buckets) override;
  std::map<std::string, at::Tensor> state(std::size_t bucket) const override {
    return compressors_.at(bucket).state();
  }
  void check_state(std::size_t bucket, const std::map<std::string, at::Tensor>& saved) const override {
    compressors_.at(bucket).check_state(saved);
  }
  void load_state(std::size_t bucket, const std::map<std::string, at::Tensor>& saved, const at::TensorOptions& options,
                  bool keep) override {
    compressors_.at(bucket).load_state(saved, options, keep);
  }
  std::size_t state_bytes() const noexcept override;

 private:
  std::shared_ptr<Communicator> comm_;
  GradientCompression kind_;
  PowerSgdOptions power_sgd_;
  std::unique_ptr<BucketReduction> uncompressed_;
  bool compressed_ = false;  // this round's (every bucket of a round is compressed, or none)
  std::vector<BucketCompressor> compressors_;
  std::vector<at::Tensor> second_;        // PowerSGD: each bucket's second factor (Q) in flight
  std::vector<InFlight> second_work_;
};

/// ZeRO's sum: each padded bucket is reduce-scattered, so every rank receives only the sum of
/// its slice; a bucket's full buffer is freed once its reduce-scatter is done, and at most
/// `in_flight` launched buckets keep theirs while backward goes on (else every bucket's buffer
/// would coexist until the end of backward: the model's whole gradient again, measured in
/// bench/README.md).
class ScatteredSum : public BucketReduction {
 public:
  ScatteredSum(std::shared_ptr<Communicator> comm, std::size_t in_flight)
      : comm_(std::move(comm)), limit_(in_flight) {}
  std::string name() const override { return "reduce_scatter"; }
  bool scatters() const noexcept override { return true; }
  void launch(std::vector<BucketBuffers>& buckets, std::size_t bucket) override;
  void finish(std::vector<BucketBuffers>& buckets, int divisor) override;
  void reset_round(std::vector<BucketBuffers>& buckets) override;
  /// The most launched buckets whose full buffers were alive at once, over its life.
  std::size_t peak_in_flight() const noexcept { return peak_; }

 private:
  // Waits for a bucket's reduce-scatter and frees its full buffer.
  void retire(BucketBuffers& bucket);

  std::shared_ptr<Communicator> comm_;
  std::size_t limit_;
  std::size_t in_flight_ = 0;
  std::size_t peak_ = 0;
};

/// The reduction a reducer uses, chosen once when the model is prepared: a reduce-scatter when
/// each rank keeps only its slice (`scatters`, ZeRO 2 and 3), else compressed
/// (DdpOptions::compression), else summed in rank order where that differs from the all-reduce
/// (DdpOptions::sum_in_rank_order: Gloo, 3 or more ranks), else the all-reduce.
std::unique_ptr<BucketReduction> make_bucket_reduction(const std::shared_ptr<Communicator>& comm, bool scatters,
                                                       const DdpOptions& ddp);

}  // namespace accelerate::distributed

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/distributed/bucket_reduction.ipp>
#endif
