// Named compile-time presets for common setups, and dispatch<Presets...>(config, fn), which
// compiles `fn` for every preset and runs the one a run-time configuration selects.
#pragma once

#include <cstddef>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <accelerate/accelerator.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/env.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/policy/slots.hpp>

namespace accelerate {

/// Common setups, by name. Each is an Accelerator type; pass a list of them to dispatch().
namespace presets {
using Cpu = Accelerator<SingleProcess>;
using CpuBf16 = Accelerator<SingleProcess, Bf16>;
using CpuFp16 = Accelerator<SingleProcess, Fp16>;
using CpuAccumulate = Accelerator<SingleProcess, Fp32, AccumulateDynamic>;
using CpuClip = Accelerator<SingleProcess, Fp32, NoAccumulation, ClipNorm<>>;
using MultiCpu = Accelerator<Gloo>;
using MultiCpuBf16 = Accelerator<Gloo, Bf16>;
using MultiCpuAccumulate = Accelerator<Gloo, Fp32, AccumulateDynamic>;
using MultiCpuBf16Accumulate = Accelerator<Gloo, Bf16, AccumulateDynamic>;
using MultiCpuClip = Accelerator<Gloo, Fp32, NoAccumulation, ClipNorm<>>;
}  // namespace presets

/// A run-time choice of configuration, with the keys of Accelerate's default_config.yaml
/// (see <accelerate/config.hpp> to read one) plus `max_grad_norm` for the Clip slot.
/// Example:
///   accelerate::RunConfig{.mixed_precision = "bf16", .num_processes = 2}
struct RunConfig {
  /// "NO", "MULTI_CPU" or "MULTI_GPU"; unset: MULTI_CPU when num_processes > 1, else NO.
  std::optional<std::string> distributed_type;
  /// "no", "bf16" or "fp16".
  std::string mixed_precision = "no";
  int num_processes = 1;
  std::size_t gradient_accumulation_steps = 1;
  /// Clip gradients to this global L2 norm (selects a ClipNorm preset).
  std::optional<double> max_grad_norm;

  /// The distributed type this configuration asks for.
  std::string resolved_distributed_type() const {
    if (distributed_type) return *distributed_type;
    return num_processes > 1 ? "MULTI_CPU" : "NO";
  }

  /// Fills unset fields from Accelerate's variables: ACCELERATE_MIXED_PRECISION,
  /// ACCELERATE_GRADIENT_ACCUMULATION_STEPS, ACCELERATE_NUM_PROCESSES.
  RunConfig& with_environment();

  /// The AcceleratorOptions fields this configuration decides.
  AcceleratorOptions apply(AcceleratorOptions options) const;
};

namespace detail {

/// Whether preset `Acc` implements `config` (exactly: no silent downgrade).
template <class Acc>
bool preset_matches(const RunConfig& config) {
  if (Acc::distributed_type() != config.resolved_distributed_type()) return false;
  if (!Acc::distributed && config.num_processes > 1) return false;
  if (Acc::mixed_precision() != config.mixed_precision) return false;
  using A = typename Acc::accumulation_policy;
  if (config.gradient_accumulation_steps > 1) {
    if (!A::dynamic && A::steps != config.gradient_accumulation_steps) return false;
  } else if (Acc::accumulating) {
    return false;
  }
  using C = typename Acc::clip_policy;
  if (config.max_grad_norm.has_value() != is_clip_norm<C>) return false;
  return !is_clip_norm<C> || std::is_same_v<C, ClipNorm<>>;  // Accelerate's max_grad_norm is the L2 norm
}

template <class Acc>
std::string preset_description() {
  using A = typename Acc::accumulation_policy;
  std::ostringstream out;
  out << "distributed_type=" << Acc::distributed_type() << " mixed_precision=" << Acc::mixed_precision()
      << " gradient_accumulation_steps="
      << (A::dynamic ? std::string("any>1") : std::to_string(A::steps))
      << " max_grad_norm=" << (is_clip_norm<typename Acc::clip_policy> ? "set" : "unset");
  return out.str();
}

}  // namespace detail

namespace detail {
template <class... Lists>
struct concat_lists;
template <class... A>
struct concat_lists<type_list<A...>> {
  using type = type_list<A...>;
};
template <class... A, class... B, class... Rest>
struct concat_lists<type_list<A...>, type_list<B...>, Rest...> {
  using type = typename concat_lists<type_list<A..., B...>, Rest...>::type;
};
}  // namespace detail

/// Every Accelerator<B, P, A, C> with B, P, A and C taken from the four lists, in order.
/// Example:
///   using Supported = accelerate::all_combinations<type_list<SingleProcess, Gloo>,
///       type_list<Fp32, Bf16>, type_list<NoAccumulation>, type_list<NoClip>>;  // 4 presets
template <class Backends, class Precisions, class Accumulations, class Clips>
struct all_combinations_of;
template <class... B, class... P, class... A, class... C>
struct all_combinations_of<type_list<B...>, type_list<P...>, type_list<A...>, type_list<C...>> {
  template <class Bi, class Pi, class Ai>
  using with_clips = type_list<Accelerator<Bi, Pi, Ai, C>...>;
  template <class Bi, class Pi>
  using with_accumulations = typename detail::concat_lists<with_clips<Bi, Pi, A>...>::type;
  template <class Bi>
  using with_precisions = typename detail::concat_lists<with_accumulations<Bi, P>...>::type;
  using type = typename detail::concat_lists<with_precisions<B>...>::type;
};
template <class Backends, class Precisions, class Accumulations, class Clips>
using all_combinations = typename all_combinations_of<Backends, Precisions, Accumulations, Clips>::type;

/// Runs `fn.template operator()<Preset>()` for the first of `Presets` matching `config`, and
/// returns its result. Every preset is compiled; none matching is an error listing what this
/// program supports.
/// Example:
///   return accelerate::dispatch<presets::Cpu, presets::CpuBf16, presets::MultiCpu>(
///       config, [&]<class Acc>() { return train<Acc>(args); });
template <class... Presets, class Fn>
decltype(auto) dispatch(const RunConfig& config, Fn&& fn) {
  static_assert(sizeof...(Presets) > 0, "accelerate::dispatch needs at least one preset");
  using Result = decltype(fn.template operator()<std::tuple_element_t<0, std::tuple<Presets...>>>());
  std::optional<std::conditional_t<std::is_void_v<Result>, bool, Result>> result;
  bool done = false;
  auto try_one = [&]<class Acc>() {
    if (done || !detail::preset_matches<Acc>(config)) return;
    done = true;
    if constexpr (std::is_void_v<Result>) fn.template operator()<Acc>();
    else result.emplace(fn.template operator()<Acc>());
  };
  (try_one.template operator()<Presets>(), ...);
  if (!done) {
    std::ostringstream valid;
    ((valid << "\n  " << detail::preset_description<Presets>()), ...);
    detail::fail("dispatch: no compiled preset implements distributed_type=",
                 config.resolved_distributed_type(), " mixed_precision=", config.mixed_precision,
                 " gradient_accumulation_steps=", config.gradient_accumulation_steps,
                 " max_grad_norm=", config.max_grad_norm ? "set" : "unset",
                 "; this program supports:", valid.str());
  }
  if constexpr (!std::is_void_v<Result>) return Result(std::move(*result));
}

/// dispatch() over a type_list of presets (for example all_combinations<...>).
template <class... Presets, class Fn>
decltype(auto) dispatch(type_list<Presets...>, const RunConfig& config, Fn&& fn) {
  return dispatch<Presets...>(config, std::forward<Fn>(fn));
}

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/presets.ipp>
#endif
