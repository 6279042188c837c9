// The Precision slot's step state: the device check, what backward() does to the loss, what a
// prepared optimizer keeps, and the guarded optimizer step, specialised per policy. The
// primary template serves every autocast-only policy (Fp32, Bf16, a user's own); Fp16 adds
// dynamic loss scaling (LossScalingStep).
//
// Customization point: `step::PrecisionStep<P>`, specialised for a policy that does more than
// autocast (derive from LossScalingStep<P> for one that scales the loss).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

#include <accelerate/amp/grad_scaler.hpp>
#include <accelerate/checkpoint/registry.hpp>
#include <accelerate/compat/torch.hpp>
#include <accelerate/data/batch.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/options.hpp>
#include <accelerate/policy/precision.hpp>
#include <accelerate/scope/autocast.hpp>
#include <accelerate/step/optimizer_params.hpp>

namespace accelerate::step {

/// Refuses a policy whose autocast dtype the device cannot compute in. Accelerate silently
/// drops fp16 on the CPU; we fail instead of training in another precision than asked for.
template <PrecisionPolicy P>
void check_autocast_supported(const c10::Device& device) {
  if constexpr (P::autocast) {
    ACCELERATE_CHECK(compat::autocast_supports(device.type(), P::dtype), "Accelerator: mixed precision '",
                     P::name, "' is not supported by autocast on ", device, " with LibTorch ",
                     compat::torch_version, "; choose another Precision policy");
  }
}

/// The forward side of Precision policy `P`, which a step state derives from (or declares
/// alike): the prepared model opens ForwardScope around the module's forward and hands the
/// caller forward_output() of what it returned. For an autocasting policy that is
/// AutocastScope<P>, and floating outputs back in fp32 (PrecisionOptions::
/// convert_outputs_to_fp32, as Accelerate's); for one that does not (Fp32), wraps_forward is
/// false and the prepared model calls the module directly, holding nothing else.
/// Example (a policy with a forward of its own):
///   struct Fp8Forward { explicit Fp8Forward(c10::DeviceType); ... };
///   template <> class accelerate::step::PrecisionStep<Fp8> : public PrecisionStep<Bf16> {
///    public:
///     using PrecisionStep<Bf16>::PrecisionStep;
///     using ForwardScope = Fp8Forward;
///   };
template <class P>
struct AutocastForward {
  /// Whether the prepared model does anything around the module's forward.
  static constexpr bool wraps_forward = P::autocast;
  /// Opened around the module's forward, given the accelerator's device type.
  using ForwardScope = AutocastScope<P>;
  /// What the caller receives of the forward's output (a tensor, or a nest of them).
  template <class Output>
  static Output forward_output(Output output, const PrecisionOptions& options) {
    if constexpr (P::autocast && data::is_nested_v<Output>) {
      if (options.convert_outputs_to_fp32) {
        return data::map_tensors(output, [](const at::Tensor& t) {
          const bool half = t.defined() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16);
          return half ? t.to(at::kFloat) : t;
        });
      }
    }
    return output;
  }
};

/// An optimizer whose next step() can divide the gradients by a loss scale inside its own
/// kernel (accelerate::FusedAdamW, FusedAdam): a loss-scaling policy then only checks them for
/// inf/NaN instead of unscaling them in a pass of their own, when nothing clips.
/// Example:
///   static_assert(accelerate::step::UnscalesInStep<accelerate::FusedAdamW>);
template <class O>
concept UnscalesInStep = requires(O& optimizer, at::Tensor scale) { optimizer.unscale_in_next_step(scale); };

/// The step state of Precision policy `P`. This primary template is the policy that only
/// autocasts (its forward runs under AutocastScope<P>): the loss is backpropagated as it is,
/// optimizers keep nothing and always step, and it is an empty type. A specialisation has the
/// same interface:
///   PrecisionStep(const PrecisionOptions&, const c10::Device&);   // validates the device
///   wraps_forward; ForwardScope; forward_output(output, options);  // AutocastForward<P>
///   static constexpr bool scales_loss;
///   scale(loss);                      // what backward() backpropagates
///   OptimizerSlot add_optimizer(opt); // what a prepared optimizer keeps
///   unscale(slot); unscale_owners(params, caller); unscale_all(caller);  // once per step
///   agree_on_skip(slot, agree);       // hands its inf/NaN flag to the engine, if it has one
///   step(slot, run_step);             // runs (or skips) the optimizer step
///   skipped(slot); step_skipped(); loss_scale(); register_state(registry);
///   SchedulerSlot; followed_step_skipped(scheduler_slot, follows);  // a scheduler's optimizer
///   release_optimizers();             // free_memory()
///   register_state(registry);         // its checkpoint entry (Kind::precision), naming its file
/// Example:
///   static_assert(std::is_empty_v<accelerate::step::PrecisionStep<accelerate::Bf16>>);
template <class P>
class PrecisionStep : public AutocastForward<P> {
 public:
  /// What a prepared optimizer keeps for this policy: nothing.
  struct OptimizerSlot {};
  static constexpr bool scales_loss = false;

  PrecisionStep(const PrecisionOptions&, const c10::Device& device) { check_autocast_supported<P>(device); }

  static const at::Tensor& scale(const at::Tensor& loss) noexcept { return loss; }
  static OptimizerSlot add_optimizer(const torch::optim::Optimizer&) noexcept { return {}; }
  static void unscale(OptimizerSlot&) noexcept {}
  static void unscale_owners(const std::vector<at::Tensor>&, const char*) noexcept {}
  static void unscale_all(const char*) noexcept {}
  template <class Agree>
  static void agree_on_skip(OptimizerSlot&, Agree&&) noexcept {}
  template <class RunStep>
  static void step(OptimizerSlot&, RunStep&& run_step) {
    run_step();
  }
  static constexpr bool skipped(const OptimizerSlot&) noexcept { return false; }
  static constexpr bool step_skipped() noexcept { return false; }
  static void release_optimizers() noexcept {}
  /// What a prepared scheduler keeps for this policy: nothing, no step is ever skipped.
  struct SchedulerSlot {};
  template <class Follows>
  static constexpr bool followed_step_skipped(SchedulerSlot&, Follows&&) noexcept {
    return false;
  }
  static constexpr double loss_scale() noexcept { return 1.0; }
  static void register_state(checkpoint::Registry&) noexcept {}
};

/// Dynamic loss scaling (PyTorch's GradScaler semantics) on top of P's autocast: backward
/// multiplies the loss by the scale, each optimizer's gradients are unscaled once per step
/// (before clipping), a step whose gradients hold an inf or NaN is skipped and the scale
/// adjusted. The scaler's state is saved with the checkpoint.
template <PrecisionPolicy P>
class LossScalingStep : public AutocastForward<P> {
 public:
  /// Per optimizer: its parameters, whether they were unscaled in this step, what was found.
  using OptimizerSlot = std::shared_ptr<OptimizerAmpState>;
  static constexpr bool scales_loss = true;

  LossScalingStep(const PrecisionOptions& options, const c10::Device& device)
      : scaler_(options.grad_scaler, device) {
    check_autocast_supported<P>(device);
  }
  // register_state() hands the registry pointers to this object.
  LossScalingStep(const LossScalingStep&) = delete;
  LossScalingStep& operator=(const LossScalingStep&) = delete;

  at::Tensor scale(const at::Tensor& loss) const { return scaler_.scale(loss); }

  OptimizerSlot add_optimizer(torch::optim::Optimizer& optimizer) {
    auto slot = std::make_shared<OptimizerAmpState>();
    slot->params = optimizer_params(optimizer);
    optimizers_.push_back(slot);
    owners_.push_back(&optimizer);
    return slot;
  }

  void unscale(OptimizerSlot& slot) { scaler_.unscale_(slot->params, *slot); }

  /// For an optimizer that unscales inside its step kernel (UnscalesInStep): records inf/NaN
  /// without touching the gradients and returns the scale to hand the optimizer; undefined
  /// when they were already unscaled in this step (clip_grad_norm_, unscale_gradients).
  at::Tensor check_for_unscale_in_step(OptimizerSlot& slot) {
    if (slot->unscaled) return {};
    scaler_.check_(slot->params, *slot);
    return scaler_.scale_tensor();
  }

  /// Unscales the gradients of the optimizers owning any of `params` (a user's clip call).
  void unscale_owners(const std::vector<at::Tensor>& params, const char* caller) {
    for (auto& slot : optimizers_) {
      const bool owns = std::any_of(params.begin(), params.end(), [&](const at::Tensor& p) {
        return std::any_of(slot->params.begin(), slot->params.end(), [&](const at::Tensor& q) { return q.is_same(p); });
      });
      if (owns) unscale_once(*slot, caller);
    }
  }

  /// Unscales the gradients of every prepared optimizer (unscale_gradients()).
  void unscale_all(const char* caller) {
    for (auto& slot : optimizers_) unscale_once(*slot, caller);
  }

  /// Hands the step's inf/NaN flag to `agree` (the engine's agree_on_found_inf), so ranks
  /// that each checked only their gradient shard skip together.
  template <class Agree>
  void agree_on_skip(OptimizerSlot& slot, Agree&& agree) {
    agree(slot->found_inf);
  }

  template <class RunStep>
  void step(OptimizerSlot& slot, RunStep&& run_step) {
    // Every rank sees the same inf/NaN: gradients are synchronised before this point, and a
    // sharded engine's ranks agreed on it (agree_on_skip).
    const bool skip = slot->found_inf.template item<float>() > 0;
    if (!skip) run_step();
    slot->skipped = skip;
    scaler_.update(slot->found_inf);
    slot->unscaled = false;
  }

  static bool skipped(const OptimizerSlot& slot) noexcept { return slot->skipped; }
  /// Whether any prepared optimizer's last step was skipped for an inf/NaN gradient (as
  /// Accelerate's optimizer_step_was_skipped).
  bool step_skipped() const noexcept {
    return std::any_of(optimizers_.begin(), optimizers_.end(), [](const OptimizerSlot& s) { return s->skipped; });
  }

  /// Forgets the prepared optimizers (free_memory()); the slots their prepared objects hold
  /// stay valid.
  void release_optimizers() noexcept {
    optimizers_.clear();
    owners_.clear();
  }

  /// The optimizer a prepared scheduler follows, found when first needed by asking
  /// `follows(optimizer)` of each prepared optimizer (a scheduler does not name its own).
  struct SchedulerSlot {
    OptimizerSlot optimizer;
  };
  /// Whether the last step of the scheduler's optimizer was skipped; a scheduler whose
  /// optimizer is unknown (`follows` never true: ReduceLROnPlateau, or an optimizer that was not
  /// prepared) follows them all, skipping when any skipped.
  template <class Follows>
  bool followed_step_skipped(SchedulerSlot& scheduler, Follows&& follows) {
    for (std::size_t i = 0; !scheduler.optimizer && i < owners_.size(); ++i)
      if (follows(*owners_[i])) scheduler.optimizer = optimizers_[i];
    return scheduler.optimizer ? scheduler.optimizer->skipped : step_skipped();
  }
  double loss_scale() const { return scaler_.get_scale(); }
  GradScaler& scaler() noexcept { return scaler_; }

  /// The scaler is one file of the checkpoint, written by the main rank: scaler.json, as
  /// Accelerate names it.
  void register_state(checkpoint::Registry& registry) {
    registry.add({.kind = checkpoint::Entry::Kind::precision,
                  .owner = checkpoint::EntryOwner::main_rank,
                  .save = [this] { return scaler_.state_dict(); },
                  .load = [this](const StateDict& s) { scaler_.load_state_dict(s); },
                  .stem = "scaler"});
  }

 private:
  // Unscaling twice would divide the gradients by the scale twice.
  void unscale_once(OptimizerAmpState& slot, const char* caller) {
    ACCELERATE_CHECK(!slot.unscaled, caller, ": the gradients of these parameters were already unscaled in "
                     "this optimizer step (by clip_grad_norm_, clip_grad_value_ or unscale_gradients); they "
                     "are unscaled once per step, as torch.amp.GradScaler.unscale_");
    scaler_.unscale_(slot.params, slot);
  }

  GradScaler scaler_;
  std::vector<OptimizerSlot> optimizers_;
  std::vector<torch::optim::Optimizer*> owners_;  // optimizers_[i]'s optimizer
};

/// Fp16: float16 autocast with dynamic loss scaling.
template <>
class PrecisionStep<Fp16> : public LossScalingStep<Fp16> {
 public:
  using LossScalingStep<Fp16>::LossScalingStep;
};

/// What the step context asks of a Precision policy's step state: the interface written at
/// PrecisionStep. The Accelerator checks it once, so a specialisation missing part of it is one
/// error naming the policy, not a cascade from inside the step context.
/// Example:
///   static_assert(accelerate::step::PrecisionStepState<accelerate::step::PrecisionStep<MyPrecision>>);
template <class S>
concept PrecisionStepState =
    std::constructible_from<S, const PrecisionOptions&, const c10::Device&> &&
    requires(S& state, const S& cstate, const at::Tensor& loss, torch::optim::Optimizer& optimizer,
             typename S::OptimizerSlot& slot, const typename S::OptimizerSlot& cslot,
             typename S::SchedulerSlot& scheduler, const std::vector<at::Tensor>& params,
             checkpoint::Registry& registry, void (*run_step)(), void (*agree)(at::Tensor&),
             bool (*follows)(torch::optim::Optimizer&), const PrecisionOptions& options) {
      { S::wraps_forward } -> std::convertible_to<bool>;
      requires std::constructible_from<typename S::ForwardScope, c10::DeviceType>;
      { S::forward_output(loss, options) } -> std::same_as<at::Tensor>;
      { S::scales_loss } -> std::convertible_to<bool>;
      { state.scale(loss) } -> std::convertible_to<at::Tensor>;
      { state.add_optimizer(optimizer) } -> std::convertible_to<typename S::OptimizerSlot>;
      state.unscale(slot);
      state.unscale_owners(params, "caller");
      state.unscale_all("caller");
      state.agree_on_skip(slot, agree);
      state.step(slot, run_step);
      { cstate.skipped(cslot) } -> std::convertible_to<bool>;
      { cstate.step_skipped() } -> std::convertible_to<bool>;
      { cstate.loss_scale() } -> std::convertible_to<double>;
      { state.followed_step_skipped(scheduler, follows) } -> std::convertible_to<bool>;
      state.register_state(registry);
      state.release_optimizers();
    };

}  // namespace accelerate::step
