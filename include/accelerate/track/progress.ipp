// Bodies of progress.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/track/progress.hpp>

namespace accelerate {

ACCELERATE_INLINE void ProgressBar::update(std::optional<double> loss) {
  ++done_;
  if (loss) loss_ = *loss;
  if (!options_.enabled) return;
  if (interactive_) draw('\r');
  else if (done_ % options_.plain_every == 0) draw('\n');
}

ACCELERATE_INLINE void ProgressBar::close() {
  if (closed_ || !options_.enabled) return;
  closed_ = true;
  if (interactive_) {
    draw('\r');
    std::cout << '\n' << std::flush;
  } else if (done_ % options_.plain_every != 0) {
    draw('\n');
  }
}

ACCELERATE_INLINE void ProgressBar::draw(char end) {
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

}  // namespace accelerate
