// accelerate::Error and ACCELERATE_CHECK, the one way the library reports bad run-time input.
#pragma once

#include <initializer_list>
#include <ostream>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <accelerate/detail/linkage.hpp>

namespace accelerate {

/// Every error the library raises on bad input or a failed operation. The message names the
/// subject (file, key, rank, option), what was expected and what was found, then the fix.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

/// One part of an error message: where it is and the function that streams its type. fail()
/// passes its parts this way to one function that is not a template, so each of the library's
/// checks costs a translation unit a few instructions rather than a stream expression of its
/// own (bench/README.md, "Compile cost of a trainer").
struct MessagePart {
  const void* value;
  void (*write)(std::ostream&, const void*);
};

template <class T>
void write_message_part(std::ostream& out, const void* value) {
  out << *static_cast<const T*>(value);
}

inline void write_message_text(std::ostream& out, const void* text) { out << static_cast<const char*>(text); }

template <class T>
MessagePart message_part(const T& part) {
  if constexpr (std::is_array_v<T>) return {part, &write_message_text};  // a string literal
  else return {&part, &write_message_part<T>};
}

/// Throws accelerate::Error with the parts streamed one after another.
[[noreturn]] void throw_message(std::initializer_list<MessagePart> parts);

template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw_message({message_part(parts)...});
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

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/detail/check.ipp>
#endif
