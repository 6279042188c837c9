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

/// Calls on_flag(flag, value) for each argument after the program's name; value() returns the
/// argument after the flag (and consumes it), or calls `fail` naming the flag when none is left.
template <class Fail, class OnFlag>
void for_each_flag(int argc, char** argv, Fail&& fail, OnFlag&& on_flag) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(flag + " needs a value");
      return argv[++i];
    };
    on_flag(flag, value);
  }
}

}  // namespace examples
