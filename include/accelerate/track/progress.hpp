// ProgressBar: a one-line progress bar (rate, ETA, loss) for the main process on a terminal,
// or a plain line every so often when stdout is not a terminal.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include <accelerate/detail/linkage.hpp>

namespace accelerate {

/// How a ProgressBar shows itself.
struct ProgressOptions {
  /// Show anything at all (give false on non-main processes, or when asked to be quiet).
  bool enabled = true;
  /// Redraw one line in place; unset means "when stdout is a terminal".
  std::optional<bool> interactive;
  /// Without a terminal, print a plain line every this many updates (and at the end).
  std::size_t plain_every = 100;
  std::string description;
};

/// Progress over a known number of steps: update() after each step with optional metrics,
/// close() (or the destructor) at the end.
/// Example:
///   accelerate::ProgressBar bar(loader.size(), {.enabled = acc.is_main_process(), .description = "epoch 1"});
///   for (auto& [x, y] : loader) { ...; bar.update(loss.item<double>()); }
class ProgressBar {
 public:
  ProgressBar(std::size_t total, ProgressOptions options = {})
      : total_(total), options_(std::move(options)),
        interactive_(options_.interactive.value_or(::isatty(::fileno(stdout)) == 1)),
        start_(std::chrono::steady_clock::now()) {}
  ~ProgressBar() { close(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// One more step done; `loss`, when given, is shown as a running value.
  void update(std::optional<double> loss = std::nullopt);

  /// Finishes the line (prints the final state once).
  void close();

  std::size_t done() const noexcept { return done_; }

 private:
  void draw(char end);

  std::size_t total_;
  ProgressOptions options_;
  bool interactive_;
  std::chrono::steady_clock::time_point start_;
  std::size_t done_ = 0;
  std::optional<double> loss_;
  bool closed_ = false;
};

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/track/progress.ipp>
#endif
