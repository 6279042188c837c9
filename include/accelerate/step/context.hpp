// step::Context: what an Accelerator and the objects it prepared share — the engine, the
// run-time state every configuration has, one step state per policy slot — and the order in
// which the step states act in an optimizer step. Prepared objects hold a pointer to it, never
// to the Accelerator, so the Accelerator's public API is only what users call.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

#include <accelerate/checkpoint/hooks.hpp>
#include <accelerate/checkpoint/registry.hpp>
#include <accelerate/checkpoint/state.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/distributed/engine.hpp>
#include <accelerate/gradient_state.hpp>
#include <accelerate/options.hpp>
#include <accelerate/step/accumulation.hpp>
#include <accelerate/step/clip.hpp>
#include <accelerate/step/item_weighting.hpp>
#include <accelerate/step/precision.hpp>
#include <accelerate/track/trackers.hpp>

namespace accelerate {

namespace detail {

/// State every Accelerator has, whatever its policies. Made and destroyed out of line: its
/// members' construction and destruction (the options, the registry, trackers, a background
/// save) are the same for every configuration.
struct CoreState {
  CoreState(const AcceleratorOptions& options, c10::Device device);
  CoreState(const CoreState&) = delete;
  CoreState& operator=(const CoreState&) = delete;
  ~CoreState();

  AcceleratorOptions options;
  c10::Device device{c10::kCPU};
  GradientState gradient_state;            // the prepared dataloaders being iterated now
  checkpoint::Registry checkpoint;          // what save_state/load_state visit
  bool trigger = false;                    // set_trigger()/check_trigger()
  std::uint64_t losses_checked = 0;        // backward() calls under check_finite_loss
  Trackers trackers;                       // main process only
  // The asynchronous save in flight, made at the first one (its destructor waits for it).
  std::unique_ptr<checkpoint::BackgroundSave> background_save;
  checkpoint::StateHooks state_hooks;      // register_save/load_state_pre_hook
  step::ItemWeighting items;               // backward(loss, {.num_items}) in this window
  std::vector<std::weak_ptr<torch::optim::Optimizer>> optimizers;  // prepared, for unscale_gradients()
};

}  // namespace detail

namespace step {

/// The shared state of an Accelerator<Backend, Precision, Accumulation, Clip> whose Backend's
/// engine is `Engine`. A policy that is off contributes an empty member that takes no space
/// (tests/static/zero_cost.cpp). Not for users: reach it through the Accelerator.
template <class Engine, class Accumulation, class Precision, class Clip>
struct Context {
  using accumulation_step = AccumulationStep<Accumulation>;
  using precision_step = PrecisionStep<Precision>;
  using clip_step = ClipStep<Clip>;
  /// What a prepared optimizer keeps for the Precision policy (nothing, or its scaler state).
  using optimizer_slot = typename precision_step::OptimizerSlot;

  /// Whether a prepared optimizer's step() is exactly the optimizer's step(): no policy acts
  /// on it, the engine leaves optimizer steps to the optimizer, and there is one process (with
  /// several, a closure optimizer reads the loss averaged over them: mean_loss_over_processes).
  static constexpr bool plain_optimizer_step = !accumulation_step::accumulating && !precision_step::scales_loss &&
                                               !clip_step::active && !distributed::customises_step_optimizer<Engine> &&
                                               !Engine::distributed;
  /// Whether a prepared scheduler's step() is exactly the scheduler's step().
  static constexpr bool plain_scheduler_step =
      !accumulation_step::accumulating && !precision_step::scales_loss && !Engine::distributed;

  /// Builds the engine (joins the other processes), picks the device, and registers the step
  /// states a checkpoint carries: the grad scaler (Fp16) and each rank's micro-step counter.
  Context(const AcceleratorOptions& options, std::string_view fingerprint)
      : engine(options, fingerprint),
        core(options, engine.device(options)),
        accumulation(options.accumulation),
        precision(options.precision, core.device) {
    precision.register_state(core.checkpoint);
    core.checkpoint.add({checkpoint::Entry::Kind::micro_step, checkpoint::EntryOwner::every_rank,
                         [this] {
                           StateDict s = accumulation.state_dict();
                           core.items.save_to(s);
                           return s;
                         },
                         [this](const StateDict& s) {
                           accumulation.load_state_dict(s);
                           core.items.load_from(s);
                         }});
  }
  // The checkpoint registry refers to this object's members.
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  /// The optimizer step's ordering contract, the same for every combination of policies:
  /// nothing off an accumulation boundary; then the true (unscaled) gradients, once, and every
  /// rank agreeing on whether they hold an inf/NaN; then
  /// clipping, on synchronised unscaled gradients; then the step itself, run by the engine
  /// (a sharded engine steps its shard) unless the Precision policy skips it (inf/NaN).
  /// An optimizer that divides by the loss scale inside its step kernel (UnscalesInStep) is
  /// handed the scale instead, when nothing clips: its gradients are only checked for inf/NaN.
  template <class Optimizer>
  void optimizer_step(Optimizer& optimizer, optimizer_slot& slot) {
    if (!accumulation.sync()) return;
    if (core.items.counted()) [[unlikely]]
      weigh_items(step::optimizer_params(optimizer));
    constexpr bool unscales_in_step =
        !clip_step::active && UnscalesInStep<Optimizer> &&
        requires(precision_step& p, optimizer_slot& s) { p.check_for_unscale_in_step(s); };
    at::Tensor step_scale;  // undefined: the gradients are unscaled already
    if constexpr (unscales_in_step) step_scale = precision.check_for_unscale_in_step(slot);
    else precision.unscale(slot);
    precision.agree_on_skip(slot, [this](at::Tensor& found_inf) { distributed::agree_on_found_inf(engine, found_inf); });
    clip.apply(engine, optimizer, core.options.clip);
    precision.step(slot, [&] {
      if constexpr (unscales_in_step)
        if (step_scale.defined()) optimizer.unscale_in_next_step(step_scale);
      distributed::step_optimizer(engine, optimizer);
    });
  }

  /// Multiplies the gradients of `holders` by world_size / the window's items, once per window
  /// and holder, when this window's losses were sums over counted items (ItemWeighting).
  void weigh_items(const std::vector<at::Tensor>& holders) {
    if (!core.items.counted()) [[likely]]
      return;
    core.items.weigh(holders, engine.world_size(), [this](double items) { return sum_over_processes(items); });
  }

  /// The same contract for an optimizer that re-evaluates the loss (LBFGS): `closure` zeroes
  /// the gradients, runs the forward and backward() and returns the loss, as often as the
  /// optimizer needs; each evaluation's synchronised gradients are clipped before the optimizer
  /// reads them. Returns the first evaluation's loss (undefined off a boundary).
  template <class Optimizer>
  at::Tensor optimizer_step(Optimizer& optimizer, optimizer_slot&, torch::optim::Optimizer::LossClosure closure) {
    static_assert(!precision_step::scales_loss,
                  "accelerate: an optimizer step with a closure (LBFGS) cannot be loss-scaled: the "
                  "optimizer reads the gradients of every evaluation, so each would need its own "
                  "unscale and inf check (torch.amp.GradScaler refuses closures too); use Bf16 or Fp32");
    static_assert(!distributed::customises_step_optimizer<Engine>,
                  "accelerate: an optimizer step with a closure (LBFGS) needs every parameter's whole "
                  "gradient (its line search and history are not elementwise), which a sharded Backend "
                  "does not keep; use a replicated Backend (Gloo, Nccl)");
    if (!accumulation.sync()) return {};
    return optimizer.step([&] {
      at::Tensor loss = closure();
      clip.apply(engine, optimizer, core.options.clip);
      return mean_loss_over_processes(loss);
    });
  }

  /// What a closure optimizer reads as the loss of one evaluation: the mean over the
  /// processes. LBFGS's stopping test and line search read it, so with each rank's own loss
  /// the ranks would take different decisions and evaluate different numbers of times, their
  /// gradient all-reduces pairing wrongly; with the mean (and the averaged gradients) every
  /// rank runs full-batch LBFGS on all ranks' data. A number, not part of any graph.
  at::Tensor mean_loss_over_processes(const at::Tensor& loss) {
    if constexpr (!Engine::distributed) {
      return loss;
    } else {
      at::Tensor sum = loss.detach().to(engine.collective_device(), at::kDouble).clone();
      engine.all_reduce(sum, Reduction::sum);
      return (sum / engine.world_size()).to(loss.device(), loss.scalar_type());
    }
  }

  /// What a prepared scheduler keeps for the Precision policy (which optimizer it follows).
  using scheduler_slot = typename precision_step::SchedulerSlot;

  /// How many times a prepared scheduler steps now: 0 when its optimizer did not step (off a
  /// boundary, or skipped; `follows(optimizer)` tells whether an optimizer is the scheduler's),
  /// else num_processes (schedules are written in single-process batches, as in Accelerate;
  /// 1 with data.split_batches, whose global batch is one), or 1 on every call without
  /// AcceleratorOptions::step_scheduler_with_optimizer.
  template <class Follows>
  int scheduler_steps_due(scheduler_slot& slot, Follows&& follows) {
    if (!core.options.step_scheduler_with_optimizer) return 1;
    if (!accumulation.sync() || precision.followed_step_skipped(slot, follows)) return 0;
    // A split global batch is the single-process batch: one step of the schedule.
    return core.options.data.split_batches ? 1 : engine.world_size();
  }

  /// `value` averaged over the processes, in double, so every rank gets the same number (when
  /// every rank passes the same value, that value to within a rounding of the sum: 3 x 0.1 / 3
  /// is 0.1 + 2e-17).
  double mean_over_processes(double value) {
    if constexpr (!Engine::distributed) return value;
    else return sum_over_processes(value) / engine.world_size();
  }

  /// `value` summed over the processes, in double, the same on every rank.
  double sum_over_processes(double value) {
    if constexpr (!Engine::distributed) {
      return value;
    } else {
      at::Tensor sum = at::full({1}, value, at::TensorOptions().dtype(at::kDouble)).to(engine.collective_device());
      engine.all_reduce(sum, Reduction::sum);
      return sum.item<double>();
    }
  }

  /// Whether the current micro-step completes an accumulation window.
  bool sync_gradients() const noexcept { return accumulation.sync(); }
  const c10::Device& device() const noexcept { return core.device; }
  const AcceleratorOptions& options() const noexcept { return core.options; }
  int num_processes() const noexcept { return engine.world_size(); }
  /// Where prepared dataloaders register their iterations.
  GradientState& gradient_state() noexcept { return core.gradient_state; }

  [[no_unique_address]] Engine engine;
  detail::CoreState core;
  [[no_unique_address]] accumulation_step accumulation;
  [[no_unique_address]] precision_step precision;
  [[no_unique_address]] clip_step clip;
};

}  // namespace step
}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/step/context.ipp>
#endif
