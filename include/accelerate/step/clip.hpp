// The Clip slot's step state: what the optimizer step does to the (synchronised, unscaled)
// gradients, and what it remembers, specialised per policy.
//
// Customization point: `step::ClipStep<C>`, specialised for a new Clip policy.
#pragma once

#include <concepts>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include <accelerate/detail/diagnostics.hpp>
#include <accelerate/distributed/engine.hpp>
#include <accelerate/options.hpp>
#include <accelerate/policy/clip.hpp>
#include <accelerate/step/optimizer_params.hpp>

namespace accelerate::step {

/// The step state of Clip policy `C`. Each policy has a specialisation with this interface:
///   static constexpr bool active;   // whether apply() does anything
///   template <class Engine> void apply(Engine&, const torch::optim::Optimizer&, const ClipOptions&);
/// and whatever it reports (ClipNorm: last_norm()). apply() runs inside the optimizer step, on
/// accumulation boundaries only, after the gradients are synchronised and unscaled; the
/// engine reduces a norm across ranks when its ranks hold different gradient shards.
/// Example (a new policy):
///   template <> class accelerate::step::ClipStep<MyClip> { public: static constexpr bool active = true; ... };
template <class C>
class ClipStep {
  static_assert(detail::dependent_false<C>,
                "accelerate: this Clip policy has no step state; specialise "
                "accelerate::step::ClipStep<Policy> (see <accelerate/step/clip.hpp>)");
};

/// NoClip: an empty type whose apply() is nothing.
template <>
class ClipStep<NoClip> {
 public:
  static constexpr bool active = false;
  template <class Engine>
  static void apply(Engine&, const torch::optim::Optimizer&, const ClipOptions&) noexcept {}
};

/// ClipNorm<P>: scales the gradients so their global P-norm is at most ClipOptions::max_norm,
/// and remembers the norm before clipping.
template <double P>
class ClipStep<ClipNorm<P>> {
 public:
  static constexpr bool active = true;
  template <class Engine>
  void apply(Engine& engine, const torch::optim::Optimizer& optimizer, const ClipOptions& options) {
    last_norm_ = distributed::clip_grad_norm(engine, optimizer_params(optimizer), options.max_norm, P);
  }
  /// The pre-clip global norm measured by the last clipping step.
  double last_norm() const noexcept { return last_norm_; }

 private:
  double last_norm_ = 0.0;
};

/// ClipValue: clamps every gradient element to [-clip_value, clip_value]; no state.
template <>
class ClipStep<ClipValue> {
 public:
  static constexpr bool active = true;
  template <class Engine>
  static void apply(Engine&, const torch::optim::Optimizer& optimizer, const ClipOptions& options) {
    torch::nn::utils::clip_grad_value_(optimizer_params(optimizer), options.clip_value);
  }
};

/// What the step context asks of a Clip policy's step state, stepping with engine `Engine`:
/// the interface written at ClipStep. The Accelerator checks it once (with the one-process
/// engine), so a specialisation missing part of it is one error naming the policy.
/// Example:
///   static_assert(accelerate::step::ClipStepState<accelerate::step::ClipStep<MyClip>, accelerate::distributed::LocalEngine>);
template <class S, class Engine>
concept ClipStepState = std::default_initializable<S> &&
                        requires(S& state, Engine& engine, const torch::optim::Optimizer& optimizer,
                                 const ClipOptions& options) {
                          { S::active } -> std::convertible_to<bool>;
                          state.apply(engine, optimizer, options);
                        };

}  // namespace accelerate::step
