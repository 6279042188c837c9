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
#include <accelerate/options.hpp>

namespace accelerate::distributed {

/// One tensor of a bucket: where it starts in the bucket's flat buffer, and its shape.
struct BucketEntry {
  int64_t offset = 0;
  std::vector<int64_t> sizes;
};

/// Orthonormalises the columns of `a` (n x r) in place, by Gram-Schmidt. A zero column stays
/// zero (PowerSGD meets one when a gradient matrix is zero).
inline void orthonormalize_columns(at::Tensor a) {
  const int64_t r = a.size(1);
  for (int64_t i = 0; i < r; ++i) {
    at::Tensor column = a.select(1, i);
    column.div_(at::linalg_vector_norm(column).clamp_min(1e-30));
    if (i + 1 < r) {
      at::Tensor rest = a.narrow(1, i + 1, r - i - 1);
      rest.sub_(column.unsqueeze(1) * at::mm(column.unsqueeze(0), rest));
    }
  }
}

/// The compression state of one bucket. Collective-free: the reducer sums what compress()
/// returns across ranks, hands the sum to decompress(), and — for PowerSGD, whose second
/// factor needs the first one's sum — sums what that returns and hands it to finish().
/// Every rank must build it from the same bucket with the same options.
class BucketCompressor {
 public:
  BucketCompressor() = default;
  BucketCompressor(GradientCompression kind, const PowerSgdOptions& options, std::vector<BucketEntry> entries)
      : kind_(kind), options_(options) {
    if (kind_ != GradientCompression::power_sgd) return;
    for (auto& entry : entries) {
      int64_t numel = 1;
      for (auto d : entry.sizes) numel *= d;
      Matrix m{entry.offset, entry.sizes.empty() ? 1 : entry.sizes.front(), 0, 0, 0, 0, 0};
      m.cols = m.rows > 0 ? numel / m.rows : 0;
      m.rank = std::min<int64_t>({options_.rank, m.rows, m.cols});
      const bool worth_it = entry.sizes.size() >= 2 && m.rank > 0 &&
                            static_cast<double>(m.rows * m.cols) >=
                                options_.min_compression_rate * static_cast<double>(m.rank * (m.rows + m.cols));
      if (!worth_it) {
        plain_.push_back({entry.offset, numel, plain_length_});
        plain_length_ += numel;
        continue;
      }
      m.p_offset = p_length_;
      m.q_offset = q_length_;
      m.error_offset = error_length_;
      p_length_ += m.rows * m.rank;
      q_length_ += m.cols * m.rank;
      error_length_ += m.rows * m.cols;
      matrices_.push_back(m);
    }
  }

  GradientCompression kind() const noexcept { return kind_; }
  /// Two sums per step (PowerSGD's P, then Q) instead of one.
  bool two_rounds() const noexcept { return kind_ == GradientCompression::power_sgd && !matrices_.empty(); }

  /// What to sum across ranks instead of `flat` (this rank's gradients; PowerSGD adds the
  /// error feedback to it in place). A buffer kept between steps.
  at::Tensor compress(at::Tensor& flat, int world_size) {
    at::NoGradGuard no_grad;
    if (kind_ == GradientCompression::fp16 || kind_ == GradientCompression::bf16) {
      // Divided before the sum, as PyTorch's hooks do, so that the sum stays in range.
      if (!wire_.defined())
        wire_ = at::empty({flat.numel()}, flat.options().dtype(kind_ == GradientCompression::fp16 ? at::kHalf : at::kBFloat16));
      wire_.copy_(flat);
      wire_.div_(world_size);
      return wire_;
    }
    // PowerSGD: [uncompressed tensors | P of every matrix], in one sum.
    if (!wire_.defined()) wire_ = at::empty({plain_length_ + p_length_}, flat.options());
    for (const auto& t : plain_) wire_.narrow(0, t.wire_offset, t.numel).copy_(flat.narrow(0, t.offset, t.numel));
    if (matrices_.empty()) return wire_;
    if (options_.error_feedback) {
      if (!error_.defined()) error_ = at::zeros({error_length_}, flat.options());
      else for (const auto& m : matrices_) matrix(flat, m).add_(error_.narrow(0, m.error_offset, m.rows * m.cols).view({m.rows, m.cols}));
    }
    if (!q_.defined() || !options_.warm_start) initialise_q(flat.options());
    for (const auto& m : matrices_) {
      at::Tensor p_m = p(m);
      at::mm_out(p_m, matrix(flat, m), q(m));
    }
    return wire_;
  }

  /// Given the sum of compress()'s tensors: for fp16/bf16 and uncompressed tensors, writes the
  /// average into `flat`; for PowerSGD's matrices returns Q to sum next (else undefined).
  at::Tensor decompress(at::Tensor& flat, int world_size) {
    at::NoGradGuard no_grad;
    if (kind_ != GradientCompression::power_sgd) {
      flat.copy_(wire_);
      return {};
    }
    for (const auto& t : plain_)
      flat.narrow(0, t.offset, t.numel).copy_(wire_.narrow(0, t.wire_offset, t.numel)).div_(world_size);
    if (matrices_.empty()) return {};
    // P = (sum of M) Q, orthonormalised; then this rank's M^T P, summed: (sum of M)^T P.
    for (const auto& m : matrices_) {
      at::Tensor p_m = p(m), q_m = q(m);
      orthonormalize_columns(p_m);
      at::mm_out(q_m, matrix(flat, m).t(), p_m);
    }
    return q_;
  }

  /// Given the sum of decompress()'s Q: the matrices' average approximated as P Q^T / world
  /// size into `flat`, and what that misses of this rank's (error-fed) gradient kept for next
  /// time.
  void finish(at::Tensor& flat, int world_size) {
    at::NoGradGuard no_grad;
    q_.div_(world_size);
    for (const auto& m : matrices_) {
      at::Tensor target = matrix(flat, m);
      if (options_.error_feedback) {
        at::Tensor error = error_.narrow(0, m.error_offset, m.rows * m.cols).view({m.rows, m.cols});
        error.copy_(target);
        at::mm_out(target, p(m), q(m).t());
        error.sub_(target);
      } else {
        at::mm_out(target, p(m), q(m).t());
      }
    }
  }

  /// What a checkpoint keeps so that a resumed run compresses as an uninterrupted one
  /// (PowerSGD; nothing otherwise, or before the first compressed step): Q, whose warm start
  /// carries over and which is the same on every rank, this rank's error feedback, and the
  /// generator Q is drawn from. Copies on the CPU (an asynchronous save writes them later).
  std::map<std::string, at::Tensor> state() const {
    std::map<std::string, at::Tensor> saved;
    if (kind_ != GradientCompression::power_sgd) return saved;
    if (q_.defined()) saved["q"] = q_.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    if (error_.defined()) saved["error"] = error_.detach().to(at::kCPU, false, true);
    if (generator_.defined()) saved["generator"] = generator_.get_state();
    return saved;
  }

  /// Finds what load_state(saved, ...) would refuse, changing nothing.
  void check_state(const std::map<std::string, at::Tensor>& saved) const {
    for (const auto& [name, tensor] : saved) {
      const int64_t expected = name == "q" ? q_length_ : name == "error" ? error_length_ : -1;
      ACCELERATE_CHECK(kind_ == GradientCompression::power_sgd && (expected >= 0 || name == "generator"),
                       "PowerSGD state: unexpected entry '", name, "' for a bucket compressed with ", to_string(kind_));
      if (name == "generator") {
        at::Generator trial = at::make_generator<at::CPUGeneratorImpl>();
        try {
          trial.set_state(tensor);
        } catch (const c10::Error& e) {
          accelerate::detail::fail("PowerSGD state: the generator state is not one a CPU generator accepts (",
                                   e.what_without_backtrace(), ")");
        }
      } else {
        ACCELERATE_CHECK(tensor.numel() == expected, "PowerSGD state: '", name, "' has ", tensor.numel(),
                         " elements, this bucket's matrices need ", expected, " (another model or rank?)");
      }
    }
  }

  /// Restores state() onto `options`' device. `keep` false (state saved by another number of
  /// processes, whose error feedback belongs to other ranks) starts everything afresh on every
  /// rank alike, as a new run would. Checked first: a refused state changes nothing.
  void load_state(const std::map<std::string, at::Tensor>& saved, const at::TensorOptions& options, bool keep) {
    check_state(saved);
    const auto find = [&](const char* name) {
      const auto it = saved.find(name);
      return it == saved.end() || !keep ? at::Tensor() : it->second;
    };
    at::Generator generator;
    if (const at::Tensor bytes = find("generator"); bytes.defined()) {
      generator = at::make_generator<at::CPUGeneratorImpl>();
      generator.set_state(bytes);
    }
    const at::Tensor q = find("q"), error = find("error");
    q_ = q.defined() ? q.reshape({q_length_}).to(options, false, true) : at::Tensor();
    error_ = error.defined() ? error.reshape({error_length_}).to(options, false, true) : at::Tensor();
    generator_ = generator;
  }

  /// Bytes of state kept between steps (the wire buffer, Q, the error feedback).
  std::size_t state_bytes() const noexcept {
    std::size_t total = 0;
    for (const at::Tensor* t : {&wire_, &q_, &error_})
      if (t->defined()) total += t->nbytes();
    return total;
  }

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
  void initialise_q(const at::TensorOptions& options) {
    if (!generator_.defined()) generator_ = at::make_generator<at::CPUGeneratorImpl>(options_.seed);
    at::Tensor drawn = at::empty({q_length_}, at::TensorOptions().dtype(at::kFloat));
    drawn.normal_(0.0, 1.0, generator_);
    q_ = drawn.to(options);
    for (const auto& m : matrices_) orthonormalize_columns(q(m));
  }

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
