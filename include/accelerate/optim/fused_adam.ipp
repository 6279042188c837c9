// Bodies of fused_adam.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <map>
#include <tuple>

#include <accelerate/compat/torch.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/optim/fused_adam.hpp>

namespace accelerate::detail {

// The kernel takes one device and one dtype per call, and here one step count (a group's
// parameters share it unless some missed steps without a gradient).
using FusedCallKey = std::tuple<int, int, int, std::int64_t>;  // device type, index, dtype, step

// Runs `indices` of `t` through the kernel with the moments in the parameter's dtype: as they
// are, or `chunk_elements` at a time through copies when they are kept in another dtype.
ACCELERATE_INLINE void fused_adam_call(const AdamStepTensors& t, const std::vector<std::size_t>& indices, const AdamHyperparameters& h,
                     const FusedAdamOptions& fused, const at::Tensor& grad_scale) {
  const at::Tensor& first = t.params[indices.front()];
  const at::Tensor step = at::full({}, static_cast<double>(t.steps[indices.front()]),
                                   at::TensorOptions().dtype(at::kFloat).device(first.device()));
  const at::Tensor scale = grad_scale.defined() ? grad_scale.to(first.device(), at::kFloat) : at::Tensor();
  const bool converts = t.exp_avgs[indices.front()].scalar_type() != first.scalar_type();
  const auto run = [&](std::size_t begin, std::size_t end) {
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_sqs;
    for (std::size_t k = begin; k < end; ++k) {
      const std::size_t i = indices[k];
      params.push_back(t.params[i]);
      grads.push_back(t.grads[i]);
      exp_avgs.push_back(converts ? t.exp_avgs[i].to(first.scalar_type()) : t.exp_avgs[i]);
      exp_avg_sqs.push_back(converts ? t.exp_avg_sqs[i].to(first.scalar_type()) : t.exp_avg_sqs[i]);
      if (h.amsgrad) max_sqs.push_back(converts ? t.max_exp_avg_sqs[i].to(first.scalar_type()) : t.max_exp_avg_sqs[i]);
    }
    compat::fused_adam(params, grads, exp_avgs, exp_avg_sqs, max_sqs, step, h.lr, h.beta1, h.beta2, h.weight_decay,
                       h.eps, h.amsgrad, h.maximize, h.decoupled, scale);
    if (!converts) return;
    for (std::size_t k = begin; k < end; ++k) {
      const std::size_t i = indices[k], j = k - begin;
      t.exp_avgs[i].copy_(exp_avgs[j]);
      t.exp_avg_sqs[i].copy_(exp_avg_sqs[j]);
      if (h.amsgrad) t.max_exp_avg_sqs[i].copy_(max_sqs[j]);
    }
  };
  if (!converts) return run(0, indices.size());
  std::size_t begin = 0;
  std::int64_t elements = 0;
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::int64_t n = t.params[indices[k]].numel();
    if (k > begin && elements + n > fused.chunk_elements) {
      run(begin, k);
      begin = k;
      elements = 0;
    }
    elements += n;
  }
  run(begin, indices.size());
}

ACCELERATE_INLINE void fused_adam_step(const AdamStepTensors& tensors, const AdamHyperparameters& hyper,
                                       const FusedAdamOptions& fused, const at::Tensor& grad_scale) {
  ACCELERATE_CHECK(fused.chunk_elements > 0, "FusedAdamOptions::chunk_elements must be positive, got ",
                   fused.chunk_elements);
  std::map<FusedCallKey, std::vector<std::size_t>> calls;
  for (std::size_t i = 0; i < tensors.params.size(); ++i) {
    const at::Tensor& p = tensors.params[i];
    ACCELERATE_CHECK(at::isFloatingType(p.scalar_type()), "FusedAdam/FusedAdamW: parameter ", i, " of a param group is ",
                     p.scalar_type(), "; the fused kernels step floating-point parameters only");
    ACCELERATE_CHECK(tensors.grads[i].scalar_type() == p.scalar_type() && tensors.grads[i].device() == p.device(),
                     "FusedAdam/FusedAdamW: parameter ", i, " of a param group is ", p.scalar_type(), " on ", p.device(),
                     " but its gradient is ", tensors.grads[i].scalar_type(), " on ", tensors.grads[i].device());
    calls[{static_cast<int>(p.device().type()), p.device().index(), static_cast<int>(p.scalar_type()), tensors.steps[i]}]
        .push_back(i);
  }
  for (const auto& [key, indices] : calls) fused_adam_call(tensors, indices, hyper, fused, grad_scale);
}

}  // namespace accelerate::detail
