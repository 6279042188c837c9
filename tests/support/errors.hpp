// error_of: the message of the accelerate::Error a callable throws, for asserting on it.
#pragma once

#include <functional>
#include <string>

#include <accelerate/detail/check.hpp>

namespace accelerate::testing {

/// What `fn` threw as an accelerate::Error, or "no error".
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const accelerate::Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace accelerate::testing
