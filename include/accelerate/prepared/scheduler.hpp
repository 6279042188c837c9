// PreparedScheduler: the user's LR scheduler, stepped only when its optimizer really stepped
// (and num_processes times per optimizer step, as Accelerate does).
#pragma once

#include <cmath>
#include <concepts>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/optim/schedulers/reduce_on_plateau_scheduler.h>

#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/compat/torch.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/prepared/preparable.hpp>

namespace accelerate::detail {

/// A scheduler's checkpoint: its step count.
StateDict step_count_state_dict(unsigned step_count);
unsigned step_count_from(const StateDict& state);

/// A plateau scheduler's checkpoint: its evaluation state. JSON has no inf or NaN (a metric
/// may be either): those are written as text.
StateDict plateau_state_dict(const compat::PlateauState& state);
compat::PlateauState plateau_state_from(const StateDict& state);

}  // namespace accelerate::detail

namespace accelerate {

/// What prepare() returns for a scheduler. step() follows Accelerate's AcceleratedScheduler:
/// nothing on non-sync micro-steps or after its optimizer's step was skipped (Fp16; each
/// scheduler follows only the optimizer it sets the rates of); otherwise num_processes steps,
/// because schedules are written in single-process batches (with N processes each optimizer
/// step consumes N batches), or one step with data.split_batches (the global batch is one). AcceleratorOptions::step_scheduler_with_optimizer = false steps it
/// on every call instead. With Accelerator<> step() is the scheduler's step().
///
/// A torch::optim::ReduceLROnPlateauScheduler is stepped with a metric, step(metric), under the
/// same conditions but once, not num_processes times: its patience counts evaluations, not
/// batches (Accelerate steps it num_processes times, which divides the patience by them). The
/// metric is first averaged over the processes (one all-reduce of a double), so every rank
/// reduces its learning rates at the same evaluation even when each passes its own shard's
/// loss; every process must call step(metric). Its state (best metric, evaluations without
/// improvement, cooldown) is saved with the checkpoint. Since LibTorch does not say which
/// optimizer a plateau scheduler sets, it is skipped when any prepared optimizer skipped.
///
/// User-written schedulers derived from torch::optim::LRScheduler are stepped alike; their
/// checkpoint is the step count, or their own state_dict()/load_state_dict() (Stateful).
/// Example:
///   torch::optim::StepLR lr(optimizer, /*step_size=*/10, /*gamma=*/0.5);
///   auto [sched] = acc.prepare(lr);   sched.step();
///   torch::optim::ReduceLROnPlateauScheduler plateau(optimizer);
///   auto [on_plateau] = acc.prepare(plateau);   on_plateau.step(validation_loss);
template <class Scheduler, class Acc>
class PreparedScheduler {
  using Context = typename Acc::context_type;
  static constexpr bool plain = Context::plain_scheduler_step;
  using ContextRef = detail::context_ref<Context, !plain>;
  using Slot = typename Context::scheduler_slot;
  static constexpr bool on_plateau = std::derived_from<Scheduler, torch::optim::ReduceLROnPlateauScheduler>;

 public:
  PreparedScheduler(std::shared_ptr<Scheduler> scheduler, Context* context)
      : scheduler_(std::move(scheduler)), context_(context) {}

  /// Steps the schedule as described above.
  void step()
    requires(!on_plateau)
  {
    if constexpr (plain) {
      scheduler_->step();
    } else {
      const int steps = context_->scheduler_steps_due(slot_, [this](torch::optim::Optimizer& optimizer) {
        return compat::scheduler_follows(*scheduler_, optimizer);
      });
      for (int i = 0; i < steps; ++i) scheduler_->step();
    }
  }

  /// Steps a ReduceLROnPlateau scheduler with `metric` (averaged over the processes).
  void step(float metric)
    requires on_plateau
  {
    if constexpr (plain) {
      scheduler_->step(metric);
    } else {
      if (context_->scheduler_steps_due(slot_, [](torch::optim::Optimizer&) { return false; }) == 0) return;
      scheduler_->step(static_cast<float>(context_->mean_over_processes(metric)));
    }
  }

  Scheduler* operator->() const noexcept { return scheduler_.get(); }
  Scheduler& unwrap() const noexcept { return *scheduler_; }

  /// The scheduler's step count (its learning rates are part of the optimizer's state), or a
  /// plateau scheduler's evaluation state.
  StateDict state_dict() const {
    if constexpr (Stateful<Scheduler>) return scheduler_->state_dict();
    else if constexpr (on_plateau) return detail::plateau_state_dict(compat::plateau_state(*scheduler_));
    else return detail::step_count_state_dict(compat::scheduler_step_count(*scheduler_));
  }
  void load_state_dict(const StateDict& state) {
    if constexpr (Stateful<Scheduler>) scheduler_->load_state_dict(state);
    else if constexpr (on_plateau) compat::set_plateau_state(*scheduler_, detail::plateau_state_from(state));
    else compat::set_scheduler_step_count(*scheduler_, detail::step_count_from(state));
  }

 private:
  std::shared_ptr<Scheduler> scheduler_;
  [[no_unique_address]] ContextRef context_;
  [[no_unique_address]] Slot slot_;
};

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/prepared/scheduler.ipp>
#endif
