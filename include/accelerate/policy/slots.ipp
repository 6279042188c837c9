// Bodies of slots.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/policy/slots.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE std::string describe_slots(const std::array<std::string_view, slot_names.size()>& policies) {
  std::string out;
  // Appended piece by piece: GCC 12 warns (-Wstringop-overflow, a false positive) on the
  // concatenated temporaries once this is inlined into the fingerprint.
  for (std::size_t slot = 0; slot < policies.size(); ++slot) {
    if (slot != 0) out += ' ';
    out.append(slot_names[slot]).append("=").append(policies[slot]);
  }
  return out;
}

}  // namespace accelerate::detail
