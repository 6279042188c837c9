// The Accumulation slot: concept AccumulationPolicy and NoAccumulation, Accumulate<N> and
// AccumulateDynamic (N chosen at run time).
#pragma once

#include <concepts>
#include <cstddef>
#include <type_traits>

#include <accelerate/run_config.hpp>

namespace accelerate {

/// An Accumulation policy is an empty tag with compile-time facts:
///   - `steps`: micro-steps per optimizer step when known at compile time (0 when dynamic);
///   - `dynamic`: whether the count comes from AccumulationOptions::num_steps;
///   - optionally `static bool selected_by(const RunConfig&)`: whether a run-time configuration
///     selects it (dispatch()). Without it: a dynamic policy when gradient_accumulation_steps > 1,
///     else when it equals `steps` (1: no accumulation).
template <class A>
concept AccumulationPolicy = std::is_empty_v<A> && requires {
  { A::steps } -> std::convertible_to<std::size_t>;
  { A::dynamic } -> std::convertible_to<bool>;
};

/// Every micro-step is an optimizer step: no counter, and the accumulate scope is empty.
struct NoAccumulation {
  static constexpr std::size_t steps = 1;
  static constexpr bool dynamic = false;
};

/// N micro-steps per optimizer step, N fixed at compile time. Accumulate<1> is NoAccumulation.
/// Example:
///   accelerate::Accelerator<accelerate::Gloo, accelerate::Fp32, accelerate::Accumulate<4>> acc;
template <std::size_t N>
struct Accumulate {
  static_assert(N >= 1, "accelerate::Accumulate<N>: N must be at least 1");
  static constexpr std::size_t steps = N;
  static constexpr bool dynamic = false;
};

/// N micro-steps per optimizer step, N = AccumulationOptions::num_steps.
struct AccumulateDynamic {
  static constexpr std::size_t steps = 0;
  static constexpr bool dynamic = true;
};

namespace detail {

/// Whether `config` selects Accumulation policy `A` (see AccumulationPolicy).
template <AccumulationPolicy A>
bool accumulation_selected_by(const RunConfig& config) {
  if constexpr (states_its_selection<A>) return A::selected_by(config);
  else if constexpr (A::dynamic) return config.gradient_accumulation_steps > 1;
  else return config.gradient_accumulation_steps == A::steps;
}

}  // namespace detail
}  // namespace accelerate
