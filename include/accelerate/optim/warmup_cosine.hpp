// WarmupCosineLR: linear warm-up, then cosine decay, the schedule transformer training uses
// (transformers' get_cosine_schedule_with_warmup) and LibTorch lacks.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <accelerate/detail/linkage.hpp>

namespace accelerate {

/// How WarmupCosineLR shapes the learning rate.
struct WarmupCosineOptions {
  /// Steps of linear warm-up from 0 to each group's base rate.
  std::int64_t warmup_steps = 0;
  /// Steps of the whole schedule: the rate reaches min_lr_ratio * base at this step and stays.
  std::int64_t total_steps = 1;
  /// Cosine half-waves over the decay (transformers' num_cycles; 0.5: one decay to the floor).
  double num_cycles = 0.5;
  /// The floor, as a fraction of each group's base rate (0: decays to zero).
  double min_lr_ratio = 0.0;
};

/// Linear warm-up then cosine decay of every param group's learning rate, relative to the
/// rate each group has when the scheduler is built (its base). At step s (the number of
/// step() calls so far) the factor is s / warmup_steps during warm-up, then
/// min + (1 - min) * 0.5 * (1 + cos(2 pi num_cycles p)) with p the fraction of the decay done;
/// like PyTorch's LambdaLR, building it applies step 0's factor (0 with a warm-up).
/// Preparable like LibTorch's schedulers (stepped only when its optimizer stepped); its step
/// count travels in checkpoints, the rates themselves with the optimizer's state.
/// Example:
///   torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(3e-4));
///   accelerate::WarmupCosineLR schedule(adamw, {.warmup_steps = 100, .total_steps = 5000});
///   auto [model, opt, sched] = acc.prepare(net, adamw, schedule);
class WarmupCosineLR : public torch::optim::LRScheduler {
 public:
  WarmupCosineLR(torch::optim::Optimizer& optimizer, const WarmupCosineOptions& options);

  /// The factor applied to the base rates after `step` steps.
  double factor(std::int64_t step) const;
  /// Each param group's rate when the scheduler was built.
  const std::vector<double>& base_lrs() const noexcept { return base_; }

 protected:
  std::vector<double> get_lrs() override;

 private:
  WarmupCosineOptions options_;
  std::vector<double> base_;
};

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/optim/warmup_cosine.ipp>
#endif
