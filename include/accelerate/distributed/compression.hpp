// BucketCompressor: what a gradient bucket becomes on the wire (DdpOptions::compression) and
// how the sum that comes back becomes the average again. fp16/bf16 are casts; PowerSGD is
// written here (LibTorch ships it only in Python), following Vogels, Karimireddy and Jaggi,
// "PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization" (2019).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/options.hpp>

namespace accelerate::distributed {

/// One tensor of a bucket: where it starts in the bucket's flat buffer, and its shape.
struct BucketEntry {
  int64_t offset = 0;
  std::vector<int64_t> sizes;
};

/// Orthonormalises the columns of `a` (n x r) in place, by Gram-Schmidt. A zero column stays
/// zero (PowerSGD meets one when a gradient matrix is zero).
void orthonormalize_columns(at::Tensor a);

/// The compression state of one bucket. Collective-free: the reducer sums what compress()
/// returns across ranks, hands the sum to decompress(), and — for PowerSGD, whose second
/// factor needs the first one's sum — sums what that returns and hands it to finish().
/// Every rank must build it from the same bucket with the same options.
class BucketCompressor {
 public:
  BucketCompressor() = default;
  BucketCompressor(GradientCompression kind, const PowerSgdOptions& options, std::vector<BucketEntry> entries);

  GradientCompression kind() const noexcept { return kind_; }
  /// Two sums per step (PowerSGD's P, then Q) instead of one.
  bool two_rounds() const noexcept { return kind_ == GradientCompression::power_sgd && !matrices_.empty(); }

  /// What to sum across ranks instead of `flat` (this rank's gradients; PowerSGD adds the
  /// error feedback to it in place). A buffer kept between steps.
  at::Tensor compress(at::Tensor& flat, int world_size);

  /// Given the sum of compress()'s tensors: for fp16/bf16 and uncompressed tensors, writes the
  /// average into `flat`; for PowerSGD's matrices returns Q to sum next (else undefined).
  at::Tensor decompress(at::Tensor& flat, int world_size);

  /// Given the sum of decompress()'s Q: the matrices' average approximated as P Q^T / world
  /// size into `flat`, and what that misses of this rank's (error-fed) gradient kept for next
  /// time.
  void finish(at::Tensor& flat, int world_size);

  /// What a checkpoint keeps so that a resumed run compresses as an uninterrupted one
  /// (PowerSGD; nothing otherwise, or before the first compressed step): Q, whose warm start
  /// carries over and which is the same on every rank, this rank's error feedback, and the
  /// generator Q is drawn from. Copies on the CPU (an asynchronous save writes them later).
  std::map<std::string, at::Tensor> state() const;

  /// Finds what load_state(saved, ...) would refuse, changing nothing.
  void check_state(const std::map<std::string, at::Tensor>& saved) const;

  /// Restores state() onto `options`' device. `keep` false (state saved by another number of
  /// processes, whose error feedback belongs to other ranks) starts everything afresh on every
  /// rank alike, as a new run would. Checked first: a refused state changes nothing.
  void load_state(const std::map<std::string, at::Tensor>& saved, const at::TensorOptions& options, bool keep);

  /// Bytes of state kept between steps (the wire buffer, Q, the error feedback).
  std::size_t state_bytes() const noexcept;

 private:
  struct Plain {
    int64_t offset, numel, wire_offset;
  };
  struct Matrix {
    int64_t offset, rows, cols, rank, p_offset, q_offset, error_offset;
  };

  static at::Tensor matrix(at::Tensor& flat, const Matrix& m) {
    return flat.narrow(0, m.offset, m.rows * m.cols).view({m.rows, m.cols});
  }
  at::Tensor p(const Matrix& m) { return wire_.narrow(0, plain_length_ + m.p_offset, m.rows * m.rank).view({m.rows, m.rank}); }
  at::Tensor q(const Matrix& m) { return q_.narrow(0, m.q_offset, m.cols * m.rank).view({m.cols, m.rank}); }

  // Random Q from this compressor's own generator (the same sequence on every rank),
  // orthonormalised; drawn on the CPU so every device gets the same numbers.
  void initialise_q(const at::TensorOptions& options);

  GradientCompression kind_ = GradientCompression::none;
  PowerSgdOptions options_{};
  std::vector<Plain> plain_;
  std::vector<Matrix> matrices_;
  int64_t plain_length_ = 0, p_length_ = 0, q_length_ = 0, error_length_ = 0;
  at::Tensor wire_;   // what is summed first
  at::Tensor q_;      // PowerSGD's Q of every matrix (summed second)
  at::Tensor error_;  // error feedback of every matrix
  at::Generator generator_;
};

}  // namespace accelerate::distributed

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/distributed/compression.ipp>
#endif
