// accelerate::Error and ACCELERATE_CHECK, the one way the library reports bad run-time input.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace accelerate {

/// Every error the library raises on bad input or a failed operation. The message names the
/// subject (file, key, rank, option), what was expected and what was found, then the fix.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw Error(concat(std::forward<Parts>(parts)...));
}

}  // namespace detail
}  // namespace accelerate

/// Throws accelerate::Error with the streamed message parts when `cond` is false.
/// Example:
///   ACCELERATE_CHECK(n > 0, "AcceleratorOptions::ddp.bucket_cap_bytes: must be > 0, got ", n);
#define ACCELERATE_CHECK(cond, ...)                 \
  do {                                              \
    if (!(cond)) [[unlikely]] {                     \
      ::accelerate::detail::fail(__VA_ARGS__);      \
    }                                               \
  } while (false)
