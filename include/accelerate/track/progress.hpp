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
  void update(std::optional<double> loss = std::nullopt) {
    ++done_;
    if (loss) loss_ = *loss;
    if (!options_.enabled) return;
    if (interactive_) draw('\r');
    else if (done_ % options_.plain_every == 0) draw('\n');
  }

  /// Finishes the line (prints the final state once).
  void close() {
    if (closed_ || !options_.enabled) return;
    closed_ = true;
    if (interactive_) {
      draw('\r');
      std::cout << '\n' << std::flush;
    } else if (done_ % options_.plain_every != 0) {
      draw('\n');
    }
  }

  std::size_t done() const noexcept { return done_; }

 private:
  void draw(char end) {
    using namespace std::chrono;
    const double elapsed = duration<double>(steady_clock::now() - start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
    const double eta = rate > 0 && total_ > done_ ? static_cast<double>(total_ - done_) / rate : 0.0;
    std::ostringstream line;
    if (!options_.description.empty()) line << options_.description << ' ';
    if (interactive_) {
      constexpr std::size_t width = 30;
      const std::size_t filled = total_ ? std::min(width, done_ * width / total_) : 0;
      line << '[' << std::string(filled, '#') << std::string(width - filled, ' ') << "] ";
    }
    line << done_ << '/' << total_;
    char numbers[96];
    std::snprintf(numbers, sizeof numbers, " %.1f it/s eta %.0fs", rate, eta);
    line << numbers;
    if (loss_) {
      std::snprintf(numbers, sizeof numbers, " loss %.4f", *loss_);
      line << numbers;
    }
    if (end == '\r') std::cout << '\r' << line.str() << "\033[K" << std::flush;
    else std::cout << line.str() << '\n' << std::flush;
  }

  std::size_t total_;
  ProgressOptions options_;
  bool interactive_;
  std::chrono::steady_clock::time_point start_;
  std::size_t done_ = 0;
  std::optional<double> loss_;
  bool closed_ = false;
};

}  // namespace accelerate
