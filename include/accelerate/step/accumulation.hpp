// The Accumulation slot's step state: the micro-step counter, whether this micro-step is an
// accumulation boundary, and what backward() divides the loss by, specialised per policy.
//
// Customization point: `step::AccumulationStep<A>`, specialised for a new Accumulation policy.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>

#include <ATen/core/Tensor.h>

#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/diagnostics.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/gradient_state.hpp>
#include <accelerate/options.hpp>
#include <accelerate/policy/accumulation.hpp>

namespace accelerate::step {

/// The step state of Accumulation policy `A`. Each policy has a specialisation with this
/// interface (an empty type when nothing is counted):
///   static constexpr bool accumulating;            // some micro-steps skip synchronisation
///   explicit AccumulationStep(const AccumulationOptions&);   // validates its options
///   std::size_t steps() const;   std::size_t step() const;   bool sync() const;
///   void advance(const GradientState& loaders, bool sync_with_dataloader);  // a new micro-step
///   at::Tensor divide(const at::Tensor& loss) const;          // backward()'s loss / window
///   void reset();                                             // a new window (free_memory())
///   StateDict state_dict() const;   void load_state_dict(const StateDict&);  // saved per rank
/// Example (a new policy):
///   template <> class accelerate::step::AccumulationStep<MyPolicy> : public AccumulationWindow {...};
template <class A>
class AccumulationStep {
  static_assert(detail::dependent_false<A>,
                "accelerate: this Accumulation policy has no step state; specialise "
                "accelerate::step::AccumulationStep<Policy> (see <accelerate/step/accumulation.hpp>)");
};

/// NoAccumulation: every micro-step is a boundary; no state, and sync() is a compile-time true.
template <>
class AccumulationStep<NoAccumulation> {
 public:
  static constexpr bool accumulating = false;

  explicit AccumulationStep(const AccumulationOptions& o) {
    ACCELERATE_CHECK(o.num_steps <= 1, "AcceleratorOptions::accumulation.num_steps is ", o.num_steps,
                     " but the Accumulation policy fixes 1 micro-step per optimizer step; use "
                     "Accumulate<N> or AccumulateDynamic");
  }

  static constexpr std::size_t steps() noexcept { return 1; }
  static constexpr std::size_t step() noexcept { return 0; }
  static constexpr bool sync() noexcept { return true; }
  static void advance(const GradientState&, bool) noexcept {}
  static void reset() noexcept {}
  static const at::Tensor& divide(const at::Tensor& loss) noexcept { return loss; }

  StateDict state_dict() const {
    StateDict s;
    s.values = {{"step", 0}};
    return s;
  }
  void load_state_dict(const StateDict&) {}
};

/// Accumulate<1> is NoAccumulation.
template <>
class AccumulationStep<Accumulate<1>> : public AccumulationStep<NoAccumulation> {
 public:
  using AccumulationStep<NoAccumulation>::AccumulationStep;
};

/// The counting shared by the accumulating policies, a base for new ones: a window of `steps`
/// micro-steps, cut short by the end of a prepared dataloader
/// (AccumulationOptions::sync_with_dataloader).
class AccumulationWindow {
 public:
  static constexpr bool accumulating = true;

  std::size_t steps() const noexcept { return steps_; }
  /// Micro-steps counted since the last forced sync (Accelerate's `step`).
  std::size_t step() const noexcept { return step_; }
  bool sync() const noexcept { return sync_; }

  void advance(const GradientState& loaders, bool sync_with_dataloader);

  at::Tensor divide(const at::Tensor& loss) const { return loss / divisor_; }

  /// Back to the start of a window, as a new accelerator (free_memory()).
  void reset() noexcept;

  StateDict state_dict() const;
  void load_state_dict(const StateDict& s);

 protected:
  explicit AccumulationWindow(std::size_t steps, LossDivisor loss_divisor = LossDivisor::window_length)
      : steps_(steps), loss_divisor_(loss_divisor), divisor_(static_cast<double>(steps)) {}

 private:
  std::size_t steps_;       // N: micro-steps per optimizer step
  LossDivisor loss_divisor_;
  std::size_t step_ = 0;
  bool sync_ = true;        // this micro-step completes a window
  double divisor_;          // what backward() divides the loss by in the current window
};

/// Accumulate<N>: N fixed at compile time; the option may repeat it but not contradict it.
template <std::size_t N>
class AccumulationStep<Accumulate<N>> : public AccumulationWindow {
 public:
  explicit AccumulationStep(const AccumulationOptions& o) : AccumulationWindow(N, o.loss_divisor) {
    ACCELERATE_CHECK(o.num_steps == 0 || o.num_steps == N, "AcceleratorOptions::accumulation.num_steps is ",
                     o.num_steps, " but the policy is Accumulate<", N, ">; leave it 0 or use AccumulateDynamic");
  }
};

/// AccumulateDynamic: N = AccumulationOptions::num_steps, chosen at run time.
template <>
class AccumulationStep<AccumulateDynamic> : public AccumulationWindow {
 public:
  explicit AccumulationStep(const AccumulationOptions& o)
      : AccumulationWindow(checked(o.num_steps), o.loss_divisor) {}

 private:
  static std::size_t checked(std::size_t steps) {
    ACCELERATE_CHECK(steps >= 1, "AcceleratorOptions::accumulation.num_steps must be >= 1 with "
                     "AccumulateDynamic, got ", steps);
    return steps;
  }
};

/// What the step context asks of an Accumulation policy's step state: the interface written at
/// AccumulationStep (reset() is optional). The Accelerator checks it once, so a specialisation
/// missing part of it is one error naming the policy.
/// Example:
///   static_assert(accelerate::step::AccumulationStepState<accelerate::step::AccumulationStep<MyPolicy>>);
template <class S>
concept AccumulationStepState =
    std::constructible_from<S, const AccumulationOptions&> &&
    requires(S& state, const S& cstate, const GradientState& loaders, const at::Tensor& loss, const StateDict& saved) {
      { S::accumulating } -> std::convertible_to<bool>;
      { cstate.steps() } -> std::convertible_to<std::size_t>;
      { cstate.step() } -> std::convertible_to<std::size_t>;
      { cstate.sync() } -> std::convertible_to<bool>;
      state.advance(loaders, true);
      { cstate.divide(loss) } -> std::convertible_to<at::Tensor>;
      { cstate.state_dict() } -> std::convertible_to<StateDict>;
      state.load_state_dict(saved);
    };

}  // namespace accelerate::step

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/step/accumulation.ipp>
#endif
