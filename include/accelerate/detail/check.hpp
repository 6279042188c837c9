// accelerate::Error and ACCELERATE_CHECK, the one way the library reports bad run-time input.
#pragma once

#include <cstddef>
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

// A message part as it is streamed: a string literal as `const char*`, so that messages whose
// literals differ only in length share one instantiation of concat (as arrays they made 59
// instantiations, 30 KiB of a trainer's object code, bench/README.md).
template <class Part>
const auto& message_part(const Part& part) {
  return part;
}
template <class Char, std::size_t N>
const Char* message_part(const Char (&part)[N]) {
  return part;
}

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

[[noreturn]] inline void throw_error(std::string message) { throw Error(std::move(message)); }

template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw_error(concat(message_part(parts)...));
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
