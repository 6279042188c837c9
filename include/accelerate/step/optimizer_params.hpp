// optimizer_params: every parameter an optimizer updates, the list the step states unscale
// and clip.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

namespace accelerate::step {

/// Every parameter `optimizer` updates, in param-group order.
/// Example:
///   auto params = accelerate::step::optimizer_params(optimizer);
inline std::vector<at::Tensor> optimizer_params(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> params;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) params.push_back(p);
  return params;
}

}  // namespace accelerate::step
