// Bodies of warmup_cosine.hpp (see detail/linkage.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <numbers>

#include <accelerate/detail/check.hpp>
#include <accelerate/optim/warmup_cosine.hpp>

namespace accelerate {

ACCELERATE_INLINE WarmupCosineLR::WarmupCosineLR(torch::optim::Optimizer& optimizer,
                                                 const WarmupCosineOptions& options)
    : torch::optim::LRScheduler(optimizer), options_(options) {
  ACCELERATE_CHECK(options.warmup_steps >= 0 && options.total_steps > 0 && options.warmup_steps <= options.total_steps,
                   "WarmupCosineLR: need 0 <= warmup_steps <= total_steps and total_steps > 0, got warmup_steps ",
                   options.warmup_steps, " and total_steps ", options.total_steps);
  ACCELERATE_CHECK(options.min_lr_ratio >= 0 && options.min_lr_ratio <= 1 && options.num_cycles >= 0,
                   "WarmupCosineLR: min_lr_ratio must be in [0, 1] and num_cycles >= 0, got ", options.min_lr_ratio,
                   " and ", options.num_cycles);
  base_ = get_current_lrs();
  // Step 0's rates now, as LambdaLR sets them when built: the first batch trains at them.
  for (std::size_t g = 0; g < base_.size(); ++g)
    optimizer.param_groups()[g].options().set_lr(base_[g] * factor(0));
}

ACCELERATE_INLINE double WarmupCosineLR::factor(std::int64_t step) const {
  if (step < options_.warmup_steps)
    return static_cast<double>(step) / static_cast<double>(std::max<std::int64_t>(1, options_.warmup_steps));
  const double progress =
      std::min(1.0, static_cast<double>(step - options_.warmup_steps) /
                        static_cast<double>(std::max<std::int64_t>(1, options_.total_steps - options_.warmup_steps)));
  const double cosine = std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * 2.0 * options_.num_cycles * progress)));
  return options_.min_lr_ratio + (1.0 - options_.min_lr_ratio) * cosine;
}

ACCELERATE_INLINE std::vector<double> WarmupCosineLR::get_lrs() {
  // LRScheduler::step asks for the rates of the step it is about to count.
  const double f = factor(static_cast<std::int64_t>(step_count_) + 1);
  std::vector<double> rates(base_.size());
  for (std::size_t g = 0; g < base_.size(); ++g) rates[g] = base_[g] * f;
  return rates;
}

}  // namespace accelerate
