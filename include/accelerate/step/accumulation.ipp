// Bodies of accumulation.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/step/accumulation.hpp>

namespace accelerate::step {

ACCELERATE_INLINE void AccumulationWindow::advance(const GradientState& loaders, bool sync_with_dataloader) {
  // Outside every prepared loop the loader state says nothing, so the window is N long.
  if (sync_ && loss_divisor_ == LossDivisor::window_length) {
    // A new window: divide by its real length when the dataloader ends it early, so the
    // gradient is the window's mean (Accelerate always divides by N: LossDivisor::num_steps).
    const std::size_t remaining = sync_with_dataloader ? loaders.remaining() : 0;
    divisor_ = static_cast<double>(remaining > 0 ? std::min(steps_, remaining) : steps_);
  }
  if (sync_with_dataloader && loaders.end_of_dataloader()) {
    step_ = 0;
    sync_ = true;
  } else {
    ++step_;
    sync_ = step_ % steps_ == 0;
  }
}

ACCELERATE_INLINE void AccumulationWindow::reset() noexcept {
  step_ = 0;
  sync_ = true;
  divisor_ = static_cast<double>(steps_);
}

ACCELERATE_INLINE StateDict AccumulationWindow::state_dict() const {
  StateDict s;
  s.values = {{"step", step_}, {"sync_gradients", sync_}, {"divisor", divisor_}};
  return s;
}

ACCELERATE_INLINE void AccumulationWindow::load_state_dict(const StateDict& s) {
  step_ = s.value<std::size_t>("step");
  sync_ = s.value<bool>("sync_gradients");
  divisor_ = s.value<double>("divisor");
}

}  // namespace accelerate::step
