// Bodies of presets.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/presets.hpp>

namespace accelerate {

ACCELERATE_INLINE RunConfig& RunConfig::with_environment() {
  if (auto v = detail::env_string("ACCELERATE_MIXED_PRECISION")) mixed_precision = *v;
  if (auto v = detail::env_int("ACCELERATE_GRADIENT_ACCUMULATION_STEPS"))
    gradient_accumulation_steps = static_cast<std::size_t>(*v);
  if (auto v = detail::env_int("ACCELERATE_NUM_PROCESSES")) num_processes = static_cast<int>(*v);
  return *this;
}

ACCELERATE_INLINE AcceleratorOptions RunConfig::apply(AcceleratorOptions options) const {
  if (gradient_accumulation_steps > 1) options.accumulation.num_steps = gradient_accumulation_steps;
  if (max_grad_norm) options.clip.max_norm = *max_grad_norm;
  return options;
}

}  // namespace accelerate
