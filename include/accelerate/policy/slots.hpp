// The four policy slots of an Accelerator, listed once: their names in template-argument order,
// the type_list that holds one policy per slot, and its description in fingerprints and reports.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include <accelerate/detail/linkage.hpp>
#include <accelerate/detail/type_name.hpp>

namespace accelerate {

/// A list of types (of presets, of policies for one slot, or of an Accelerator's four policies).
/// Example:
///   using Precisions = accelerate::type_list<accelerate::Fp32, accelerate::Bf16>;
template <class... Ts>
struct type_list {};

/// The slots, in template-argument order: Accelerator<Backend, Precision, Accumulation, Clip>.
inline constexpr std::array<std::string_view, 4> slot_names{"Backend", "Precision", "Accumulation", "Clip"};

namespace detail {

/// "Backend=accelerate::Gloo Precision=accelerate::Bf16 ..." for the policies named in slot
/// order.
std::string describe_slots(const std::array<std::string_view, slot_names.size()>& policies);

/// describe_slots for an Accelerator's `policies`.
template <class... Policies>
std::string describe_slots(type_list<Policies...>) {
  static_assert(sizeof...(Policies) == slot_names.size(), "one policy per slot");
  return describe_slots({type_name<Policies>()...});
}

}  // namespace detail
}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/policy/slots.ipp>
#endif
