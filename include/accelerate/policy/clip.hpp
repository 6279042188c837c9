// The Clip slot: concept ClipPolicy and NoClip, ClipNorm<P> and ClipValue (tags; what each
// does is its step state, <accelerate/step/clip.hpp>). Clipping runs on sync steps only,
// inside the prepared optimizer's step(), after gradients are synchronised and (fp16) unscaled.
#pragma once

#include <concepts>
#include <limits>
#include <string_view>
#include <type_traits>

#include <accelerate/run_config.hpp>

namespace accelerate {

/// What every Clip policy names as its `slot`. Clip policies have no other compile-time fact
/// in common (their behaviour is their step state), so without it any empty tag with a name —
/// a Backend policy — would pass for one.
struct ClipSlotTag {};

/// A Clip policy is an empty tag with `using slot = ClipSlotTag` and a `name` (diagnostics,
/// fingerprints); its behaviour is its step state, a specialisation of
/// accelerate::step::ClipStep. The threshold is a run-time option (AcceleratorOptions::clip).
/// A run-time configuration (dispatch()) selects it through its
/// `static bool selected_by(const RunConfig&)`; one without it is never selected.
/// Example:
///   struct MyClip { using slot = accelerate::ClipSlotTag; static constexpr std::string_view name = "MyClip"; };
template <class C>
concept ClipPolicy = std::is_empty_v<C> && requires {
  requires std::same_as<typename C::slot, ClipSlotTag>;
  { C::name } -> std::convertible_to<std::string_view>;
};

/// No clipping: adds no code.
struct NoClip {
  using slot = ClipSlotTag;
  static constexpr std::string_view name = "NoClip";
  /// Selected when the configuration asks for no clipping.
  static bool selected_by(const RunConfig& config) { return !config.max_grad_norm && !config.clip_value; }
};

/// Scales gradients so that their global P-norm is at most AcceleratorOptions::clip.max_norm.
/// ClipNorm<> is the L2 norm; ClipNormInf the max-abs norm.
/// Example:
///   accelerate::Accelerator<accelerate::Gloo, accelerate::Fp32, accelerate::NoAccumulation,
///                           accelerate::ClipNorm<>> acc{{.clip = {.max_norm = 1.0}}};
template <double P = 2.0>
struct ClipNorm {
  static_assert(P > 0.0, "accelerate::ClipNorm<P>: P must be positive (or infinity)");
  using slot = ClipSlotTag;
  static constexpr std::string_view name = "ClipNorm";
  static constexpr double norm_type = P;
  /// Accelerate's max_grad_norm is the L2 norm: it selects ClipNorm<2> only.
  static bool selected_by(const RunConfig& config) {
    return P == 2.0 && config.max_grad_norm.has_value() && !config.clip_value;
  }
};

/// ClipNorm with the infinity norm (largest absolute gradient element).
using ClipNormInf = ClipNorm<std::numeric_limits<double>::infinity()>;

/// Clamps every gradient element to [-clip_value, clip_value] (AcceleratorOptions::clip.clip_value).
struct ClipValue {
  using slot = ClipSlotTag;
  static constexpr std::string_view name = "ClipValue";
  /// Selected by RunConfig::clip_value.
  static bool selected_by(const RunConfig& config) { return config.clip_value.has_value() && !config.max_grad_norm; }
};

/// Whether C is ClipNorm<P> for some P (Accelerate's max_grad_norm).
template <class C>
inline constexpr bool is_clip_norm = false;
template <double P>
inline constexpr bool is_clip_norm<ClipNorm<P>> = true;

namespace detail {

/// Whether `config` selects Clip policy `C` (see ClipPolicy).
template <ClipPolicy C>
bool clip_selected_by(const RunConfig& config) {
  if constexpr (states_its_selection<C>) return C::selected_by(config);
  else return false;
}

}  // namespace detail
}  // namespace accelerate
