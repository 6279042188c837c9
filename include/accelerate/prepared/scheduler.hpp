// PreparedScheduler: the user's LR scheduler, stepped only when the optimizer really stepped
// (and num_processes times per optimizer step, as Accelerate does).
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

#include <torch/optim/schedulers/lr_scheduler.h>

#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/prepared/preparable.hpp>
#include <accelerate/compat/torch.hpp>

namespace accelerate {

/// What prepare() returns for a scheduler. step() follows Accelerate's AcceleratedScheduler:
/// nothing on non-sync micro-steps or after a skipped fp16 step; otherwise num_processes steps,
/// because schedules are written in single-process batches (with N processes each optimizer
/// step consumes N batches). AcceleratorOptions::step_scheduler_with_optimizer = false steps it
/// on every call instead. With Accelerator<> step() is the scheduler's step().
/// Example:
///   torch::optim::StepLR lr(optimizer, /*step_size=*/10, /*gamma=*/0.5);
///   auto [sched] = acc.prepare(lr);   sched.step();
template <class Scheduler, class Acc>
class PreparedScheduler {
  using Context = typename Acc::context_type;
  static constexpr bool plain = Context::plain_scheduler_step;
  using ContextRef = detail::context_ref<Context, !plain>;

 public:
  PreparedScheduler(std::shared_ptr<Scheduler> scheduler, Context* context)
      : scheduler_(std::move(scheduler)), context_(context) {}

  void step() {
    if constexpr (plain) {
      scheduler_->step();
    } else {
      const int steps = context_->scheduler_steps_due();
      for (int i = 0; i < steps; ++i) scheduler_->step();
    }
  }

  Scheduler* operator->() const noexcept { return scheduler_.get(); }
  Scheduler& unwrap() const noexcept { return *scheduler_; }

  /// The scheduler's step count (its learning rates are part of the optimizer's state).
  StateDict state_dict() const {
    if constexpr (Stateful<Scheduler>) {
      return scheduler_->state_dict();
    } else {
      StateDict s;
      s.values["step_count"] = compat::scheduler_step_count(*scheduler_);
      return s;
    }
  }
  void load_state_dict(const StateDict& state) {
    if constexpr (Stateful<Scheduler>) scheduler_->load_state_dict(state);
    else compat::set_scheduler_step_count(*scheduler_, state.value<unsigned>("step_count"));
  }

 private:
  std::shared_ptr<Scheduler> scheduler_;
  [[no_unique_address]] ContextRef context_;
};

}  // namespace accelerate
