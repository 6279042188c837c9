// Bodies of batch_layout.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/data/batch_layout.hpp>

namespace accelerate::data {

ACCELERATE_INLINE std::int64_t packed_bytes(const nlohmann::json& layout) {
  if (layout.is_array()) {
    std::int64_t total = 0;
    for (const auto& item : layout) total += packed_bytes(item);
    return total;
  }
  if (!layout.is_object()) return 0;  // an undefined tensor
  if (layout.contains("dtype") && layout["dtype"].is_number_integer() && layout.contains("shape") &&
      layout["shape"].is_array()) {
    std::int64_t n = static_cast<std::int64_t>(c10::elementSize(static_cast<at::ScalarType>(layout["dtype"].get<int>())));
    for (const auto& extent : layout["shape"]) n *= extent.get<std::int64_t>();
    return n;
  }
  if (layout.contains("value") && layout.size() == 1 && !layout["value"].is_object()) return 0;  // a number or string
  std::int64_t total = 0;  // a map
  for (const auto& [key, item] : layout.items()) total += packed_bytes(item);
  return total;
}

}  // namespace accelerate::data
