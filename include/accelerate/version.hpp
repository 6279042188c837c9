// The library's version; CMake reads it from here, so this is the one place to bump it.
#pragma once

#define ACCELERATE_VERSION_MAJOR 0
#define ACCELERATE_VERSION_MINOR 1
#define ACCELERATE_VERSION_PATCH 0

namespace accelerate {
/// The version as "major.minor.patch".
inline constexpr const char* version_string = "0.1.0";
}  // namespace accelerate
