// RunConfig: a run-time choice of configuration, with the keys of Accelerate's
// default_config.yaml. Each policy says whether a RunConfig selects it (its own `selected_by`,
// or else its slot's rule, next to the slot's concept in policy/); dispatch()
// (<accelerate/presets.hpp>) runs the first preset whose four policies are all selected.
#pragma once

#include <concepts>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <accelerate/detail/linkage.hpp>
#include <accelerate/options.hpp>

namespace accelerate {

/// A run-time choice of configuration, with the keys of Accelerate's default_config.yaml
/// (see <accelerate/config.hpp> to read one) plus `max_grad_norm` and `clip_value` for the Clip
/// slot.
/// Example:
///   accelerate::RunConfig{.mixed_precision = "bf16", .num_processes = 2}
///   accelerate::RunConfig{.num_processes = 4, .zero_stage = 2}   // selects Zero<Gloo, 2>
struct RunConfig {
  /// "NO", "MULTI_CPU" or "MULTI_GPU"; unset: MULTI_CPU when num_processes > 1, else NO.
  /// (A config file's DEEPSPEED is read as the transport plus `zero_stage`.)
  std::optional<std::string> distributed_type;
  /// "no", "bf16" or "fp16".
  std::string mixed_precision = "no";
  int num_processes = 1;
  std::size_t gradient_accumulation_steps = 1;
  /// Clip gradients to this global L2 norm (selects ClipNorm<>).
  std::optional<double> max_grad_norm;
  /// ZeRO stage, Accelerate's deepspeed_config.zero_stage: 1, 2 or 3 select Zero<Transport,
  /// stage>; unset or 0 selects plain data parallel.
  std::optional<int> zero_stage;
  /// Clamp every gradient element to [-clip_value, clip_value] (selects ClipValue; Accelerate
  /// has no config key for it).
  std::optional<double> clip_value;

  /// The distributed type this configuration asks for.
  std::string resolved_distributed_type() const {
    if (distributed_type) return *distributed_type;
    return num_processes > 1 ? "MULTI_CPU" : "NO";
  }

  /// The ZeRO stage asked for, 0 for none.
  int resolved_zero_stage() const { return zero_stage.value_or(0); }

  /// Fills fields from Accelerate's variables: ACCELERATE_MIXED_PRECISION,
  /// ACCELERATE_GRADIENT_ACCUMULATION_STEPS, ACCELERATE_NUM_PROCESSES and
  /// ACCELERATE_DEEPSPEED_ZERO_STAGE (what `accelerate launch` sets).
  RunConfig& with_environment();

  /// The AcceleratorOptions fields this configuration decides.
  AcceleratorOptions apply(AcceleratorOptions options) const;
};

namespace detail {

/// A slot's policy `P` with its own rule: `static bool selected_by(const RunConfig&)`.
template <class P>
concept states_its_selection = requires(const RunConfig& config) {
  { P::selected_by(config) } -> std::convertible_to<bool>;
};

}  // namespace detail
}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/run_config.ipp>
#endif
