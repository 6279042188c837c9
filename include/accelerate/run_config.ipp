// Bodies of run_config.hpp's functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/detail/env.hpp>
#include <accelerate/run_config.hpp>

namespace accelerate {

ACCELERATE_INLINE RunConfig& RunConfig::with_environment() {
  if (auto v = detail::env_string("ACCELERATE_MIXED_PRECISION")) mixed_precision = *v;
  if (auto v = detail::env_int("ACCELERATE_GRADIENT_ACCUMULATION_STEPS"))
    gradient_accumulation_steps = static_cast<std::size_t>(*v);
  if (auto v = detail::env_int("ACCELERATE_NUM_PROCESSES")) num_processes = static_cast<int>(*v);
  if (auto v = detail::env_int("ACCELERATE_DEEPSPEED_ZERO_STAGE")) zero_stage = static_cast<int>(*v);
  return *this;
}

ACCELERATE_INLINE AcceleratorOptions RunConfig::apply(AcceleratorOptions options) const {
  if (gradient_accumulation_steps > 1) options.accumulation.num_steps = gradient_accumulation_steps;
  if (max_grad_norm) options.clip.max_norm = *max_grad_norm;
  if (clip_value) options.clip.clip_value = *clip_value;
  return options;
}

}  // namespace accelerate
