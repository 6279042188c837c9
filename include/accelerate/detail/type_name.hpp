// detail::type_name<T>(): a readable type name for diagnostics and configuration fingerprints.
#pragma once

#include <string_view>

namespace accelerate::detail {

/// The compiler's spelling of T, taken from __PRETTY_FUNCTION__ (GCC and Clang).
template <class T>
constexpr std::string_view type_name() noexcept {
  std::string_view name = __PRETTY_FUNCTION__;
  // GCC: "... type_name() [with T = X; std::string_view = ...]"; Clang: "... [T = X]".
  const auto start = name.find("T = ") + 4;
  auto end = name.find(';', start);
  if (end == std::string_view::npos) end = name.rfind(']');
  return name.substr(start, end - start);
}

}  // namespace accelerate::detail
