// Bodies of grad_scaler.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/amp/grad_scaler.hpp>

namespace accelerate {

ACCELERATE_INLINE void GradScaler::unscale_(const std::vector<at::Tensor>& params, OptimizerAmpState& amp) const {
  if (amp.unscaled) return;
  check_and_multiply(params, amp, scale_.to(at::kDouble).reciprocal().to(at::kFloat));
  amp.unscaled = true;
}

ACCELERATE_INLINE void GradScaler::check_(const std::vector<at::Tensor>& params, OptimizerAmpState& amp) const {
  check_and_multiply(params, amp, at::ones({1}, scale_.options()));
}

ACCELERATE_INLINE void GradScaler::check_and_multiply(const std::vector<at::Tensor>& params, OptimizerAmpState& amp,
                                                      const at::Tensor& inv_scale) const {
  amp.found_inf = at::zeros({1}, scale_.options());
  // The fused kernel wants one device and one dtype per call.
  std::map<std::tuple<int, int, int>, std::vector<at::Tensor>> groups;  // device, index, dtype
  for (const auto& p : params) {
    const at::Tensor& g = p.grad();
    if (g.defined())
      groups[{static_cast<int>(g.device().type()), g.device().index(),
              static_cast<int>(g.scalar_type())}]
          .push_back(g);
  }
  for (auto& [key, grads] : groups) {
    const c10::Device device = grads.front().device();
    at::Tensor found = at::zeros({1}, scale_.options().device(device));
    compat::non_finite_check_and_unscale(grads, found, inv_scale.to(device));
    amp.found_inf.add_(found.to(amp.found_inf.device()));
  }
}

ACCELERATE_INLINE void GradScaler::update(const at::Tensor& found_inf) {
  at::Tensor found = found_inf.defined() ? found_inf.to(scale_.device()).clamp_max(1)
                                         : at::zeros({1}, scale_.options());
  compat::update_scale(scale_, growth_tracker_, found, options_.growth_factor,
                       options_.backoff_factor, options_.growth_interval);
}

ACCELERATE_INLINE StateDict GradScaler::state_dict() const {
  StateDict s;
  s.values = {{"scale", get_scale()},
              {"growth_tracker", growth_tracker()},
              {"growth_factor", options_.growth_factor},
              {"backoff_factor", options_.backoff_factor},
              {"growth_interval", options_.growth_interval}};
  return s;
}

ACCELERATE_INLINE void GradScaler::load_state_dict(const StateDict& s) {
  scale_.fill_(s.value<double>("scale"));
  growth_tracker_.fill_(s.value<int64_t>("growth_tracker"));
  options_.growth_factor = s.value<double>("growth_factor");
  options_.backoff_factor = s.value<double>("backoff_factor");
  options_.growth_interval = s.value<int64_t>("growth_interval");
}

}  // namespace accelerate
