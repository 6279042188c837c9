// Bodies of env.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/detail/env.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE std::optional<std::string> env_string(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

ACCELERATE_INLINE std::optional<long> env_int(const char* name) {
  auto text = env_string(name);
  if (!text) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text->c_str(), &end, 10);
  ACCELERATE_CHECK(errno == 0 && end != text->c_str() && *end == '\0' && value >= 0,
                   "environment variable ", name, "='", *text,
                   "' is not a non-negative integer");
  return value;
}

}  // namespace accelerate::detail
