// Reading the process environment with errors that name the variable.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>

#include <accelerate/detail/check.hpp>

namespace accelerate::detail {

/// The variable's value, or nullopt when it is unset or empty.
inline std::optional<std::string> env_string(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

/// The variable as a non-negative integer; a malformed value is an error naming the variable.
inline std::optional<long> env_int(const char* name) {
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
