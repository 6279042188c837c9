// The Precision slot: concept PrecisionPolicy and the built-in policies Fp32, Bf16 and Fp16.
#pragma once

#include <concepts>
#include <string_view>
#include <type_traits>

#include <c10/core/ScalarType.h>

#include <accelerate/run_config.hpp>

namespace accelerate {

/// A Precision policy is an empty tag with compile-time facts:
///   - `name`: Accelerate's `mixed_precision` value ("no", "bf16", "fp16");
///   - `autocast`: whether forward passes run under autocast;
///   - `dtype`: the autocast compute type;
///   - optionally `static bool selected_by(const RunConfig&)`: whether a run-time configuration
///     selects it (dispatch()). Without it: when the configuration's mixed_precision is `name`.
/// What else it does to the training step (Fp16's loss scaling) is its step state, a
/// specialisation of accelerate::step::PrecisionStep; an autocast-only policy needs none.
template <class P>
concept PrecisionPolicy = std::is_empty_v<P> && requires {
  { P::name } -> std::convertible_to<std::string_view>;
  { P::autocast } -> std::convertible_to<bool>;
  { P::dtype } -> std::convertible_to<c10::ScalarType>;
};

/// Full precision. The autocast scope is an empty type and no scaler exists.
struct Fp32 {
  static constexpr std::string_view name = "no";
  static constexpr bool autocast = false;
  static constexpr c10::ScalarType dtype = c10::ScalarType::Float;
};

/// bfloat16 autocast on the backend's device type (CPU or CUDA); parameters and gradients stay
/// fp32, so no loss scaling is needed.
struct Bf16 {
  static constexpr std::string_view name = "bf16";
  static constexpr bool autocast = true;
  static constexpr c10::ScalarType dtype = c10::ScalarType::BFloat16;
};

/// float16 autocast with dynamic loss scaling (PrecisionOptions::grad_scaler). On a device whose autocast
/// cannot do fp16 the Accelerator's constructor fails; it never falls back to fp32 silently.
struct Fp16 {
  static constexpr std::string_view name = "fp16";
  static constexpr bool autocast = true;
  static constexpr c10::ScalarType dtype = c10::ScalarType::Half;
};

namespace detail {

/// Whether `config` selects Precision policy `P` (see PrecisionPolicy).
template <PrecisionPolicy P>
bool precision_selected_by(const RunConfig& config) {
  if constexpr (states_its_selection<P>) return P::selected_by(config);
  else return config.mixed_precision == P::name;
}

}  // namespace detail
}  // namespace accelerate
