// Named compile-time presets for common setups, and dispatch<Presets...>(config, fn), which
// compiles `fn` for every preset and runs the first one a run-time configuration (RunConfig,
// <accelerate/run_config.hpp>) selects.
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
#include <accelerate/policy/slots.hpp>
#include <accelerate/run_config.hpp>

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

namespace detail {

/// Whether preset `Acc` implements `config`: each of its four policies is selected by it (its
/// slot's rule, or the policy's own selected_by), so no configuration is silently downgraded.
template <class Acc>
bool preset_matches(const RunConfig& config) {
  return backend_selected_by<typename Acc::backend_policy>(config) &&
         precision_selected_by<typename Acc::precision_policy>(config) &&
         accumulation_selected_by<typename Acc::accumulation_policy>(config) &&
         clip_selected_by<typename Acc::clip_policy>(config);
}

template <class Acc>
std::string preset_description() {
  using A = typename Acc::accumulation_policy;
  std::ostringstream out;
  out << "distributed_type=" << Acc::distributed_type() << " mixed_precision=" << Acc::mixed_precision()
      << " gradient_accumulation_steps=" << (A::dynamic ? std::string("any>1") : std::to_string(A::steps))
      << " (" << describe_slots(typename Acc::policies{}) << ")";
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
                 config.clip_value ? " clip_value=set" : "",
                 config.zero_stage ? " zero_stage=" + std::to_string(*config.zero_stage) : std::string(),
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

