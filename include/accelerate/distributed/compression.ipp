// Bodies of compression.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/distributed/compression.hpp>

namespace accelerate::distributed {

ACCELERATE_INLINE void orthonormalize_columns(at::Tensor a) {
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

ACCELERATE_INLINE BucketCompressor::BucketCompressor(GradientCompression kind, const PowerSgdOptions& options,
                                                     std::vector<BucketEntry> entries)
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

ACCELERATE_INLINE at::Tensor BucketCompressor::compress(at::Tensor& flat, int world_size) {
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

ACCELERATE_INLINE at::Tensor BucketCompressor::decompress(at::Tensor& flat, int world_size) {
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

ACCELERATE_INLINE void BucketCompressor::finish(at::Tensor& flat, int world_size) {
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

ACCELERATE_INLINE std::map<std::string, at::Tensor> BucketCompressor::state() const {
  std::map<std::string, at::Tensor> saved;
  if (kind_ != GradientCompression::power_sgd) return saved;
  if (q_.defined()) saved["q"] = q_.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
  if (error_.defined()) saved["error"] = error_.detach().to(at::kCPU, false, true);
  if (generator_.defined()) saved["generator"] = generator_.get_state();
  return saved;
}

ACCELERATE_INLINE void BucketCompressor::check_state(const std::map<std::string, at::Tensor>& saved) const {
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

ACCELERATE_INLINE void BucketCompressor::load_state(const std::map<std::string, at::Tensor>& saved,
                                                    const at::TensorOptions& options, bool keep) {
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

ACCELERATE_INLINE std::size_t BucketCompressor::state_bytes() const noexcept {
  std::size_t total = 0;
  for (const at::Tensor* t : {&wire_, &q_, &error_})
    if (t->defined()) total += t->nbytes();
  return total;
}

ACCELERATE_INLINE void BucketCompressor::initialise_q(const at::TensorOptions& options) {
  if (!generator_.defined()) generator_ = at::make_generator<at::CPUGeneratorImpl>(options_.seed);
  at::Tensor drawn = at::empty({q_length_}, at::TensorOptions().dtype(at::kFloat));
  drawn.normal_(0.0, 1.0, generator_);
  q_ = drawn.to(options);
  for (const auto& m : matrices_) orthonormalize_columns(q(m));
}

}  // namespace accelerate::distributed
