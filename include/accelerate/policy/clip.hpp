// The Clip slot: concept ClipPolicy and NoClip, ClipNorm<P> and ClipValue. Clipping runs on
// sync steps only, inside the prepared optimizer's step(), after gradients are synchronised
// and (fp16) unscaled.
#pragma once

#include <concepts>
#include <limits>
#include <string_view>
#include <type_traits>

namespace accelerate {

/// What a clip policy does.
enum class ClipKind { none, norm, value };

/// A Clip policy is an empty tag with compile-time facts:
///   - `kind`: none, norm or value;
///   - `norm_type`: the p of the p-norm for ClipKind::norm (infinity for the max norm).
/// The threshold is a run-time option (AcceleratorOptions::max_norm / clip_value).
template <class C>
concept ClipPolicy = std::is_empty_v<C> && requires {
  { C::kind } -> std::convertible_to<ClipKind>;
  { C::norm_type } -> std::convertible_to<double>;
};

/// No clipping: adds no code.
struct NoClip {
  static constexpr ClipKind kind = ClipKind::none;
  static constexpr double norm_type = 0.0;
};

/// Scales gradients so that their global P-norm is at most AcceleratorOptions::max_norm.
/// ClipNorm<> is the L2 norm; ClipNormInf the max-abs norm.
template <double P = 2.0>
struct ClipNorm {
  static_assert(P > 0.0, "accelerate::ClipNorm<P>: P must be positive (or infinity)");
  static constexpr ClipKind kind = ClipKind::norm;
  static constexpr double norm_type = P;
};

/// ClipNorm with the infinity norm (largest absolute gradient element).
using ClipNormInf = ClipNorm<std::numeric_limits<double>::infinity()>;

/// Clamps every gradient element to [-clip_value, clip_value] (AcceleratorOptions::clip_value).
struct ClipValue {
  static constexpr ClipKind kind = ClipKind::value;
  static constexpr double norm_type = 0.0;
};

}  // namespace accelerate
