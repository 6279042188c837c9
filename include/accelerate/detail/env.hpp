// Reading the process environment with errors that name the variable.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate::detail {

/// The variable's value, or nullopt when it is unset or empty.
std::optional<std::string> env_string(const char* name);

/// The variable as a non-negative integer; a malformed value is an error naming the variable.
std::optional<long> env_int(const char* name);

}  // namespace accelerate::detail

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/detail/env.ipp>
#endif
