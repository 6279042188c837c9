// The examples' flag values: a whole number or a real number, the whole text or a clear error.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <system_error>

namespace examples {

/// The value of `flag` given as `text`: digits only (no sign, no fraction, nothing after), in
/// range of T; otherwise `fail` (which does not return) gets a message naming both.
template <class T, class Fail>
T whole_number(const std::string& flag, const std::string& text, Fail&& fail) {
  T out{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (!text.empty() && text.front() != '-' && text.front() != '+' && error == std::errc() &&
      end == text.data() + text.size())
    return out;
  fail(flag + " needs a whole number, got '" + text + "'");
  std::abort();  // not reached: fail exits
}

/// The value of `flag` given as `text`: the whole text a finite number; otherwise `fail`.
template <class Fail>
double real_number(const std::string& flag, const std::string& text, Fail&& fail) {
  double out = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (!text.empty() && error == std::errc() && end == text.data() + text.size() && std::isfinite(out)) return out;
  fail(flag + " needs a number, got '" + text + "'");
  std::abort();  // not reached: fail exits
}

}  // namespace examples
