// PreparedOptimizer: the user's optimizer, whose step() and zero_grad() follow the
// accelerator's policies — no-ops between accumulation boundaries, unscale, clip, and a skipped
// step after an fp16 overflow.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

#include <accelerate/checkpoint/optimizer_state.hpp>
#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/prepared/preparable.hpp>

namespace accelerate {

/// What prepare() returns for an optimizer. With Accelerator<> it holds one pointer and step()
/// is the optimizer's step(); otherwise step() asks the accelerator, which
///   - does nothing on non-sync micro-steps (zero_grad too), as Accelerate's wrapper;
///   - unscales fp16 gradients once, clips them (Clip policy), and skips the step on inf/NaN.
/// Example:
///   auto [opt] = acc.prepare(torch::optim::SGD(model->parameters(), 0.1));
///   opt.step();  opt.zero_grad();
template <class Optimizer, class Acc>
class PreparedOptimizer {
  static constexpr bool needs_accelerator = Acc::optimizer_needs_accelerator;
  using AccRef = detail::accelerator_ref<Acc, needs_accelerator>;
  using AmpSlot = typename Acc::optimizer_amp_slot;

 public:
  PreparedOptimizer(std::shared_ptr<Optimizer> optimizer, Acc* accelerator, AmpSlot amp)
      : optimizer_(std::move(optimizer)), acc_(accelerator), amp_(std::move(amp)) {}

  /// The optimizer step, subject to the policies above.
  void step() {
    if constexpr (needs_accelerator) acc_->optimizer_step(*optimizer_, amp_);
    else optimizer_->step();
  }

  /// Clears gradients (set to undefined by default, as LibTorch 2.x); a no-op on non-sync
  /// micro-steps so gradients keep accumulating.
  void zero_grad(bool set_to_none = true) {
    if constexpr (Acc::accumulating) {
      if (!acc_->sync_gradients()) return;
    }
    optimizer_->zero_grad(set_to_none);
  }

  /// True when the last step() was skipped because of an inf/NaN gradient (fp16).
  bool step_was_skipped() const {
    if constexpr (Acc::precision_policy::uses_grad_scaler) return amp_->skipped;
    else return false;
  }

  Optimizer* operator->() const noexcept { return optimizer_.get(); }
  Optimizer& operator*() const noexcept { return *optimizer_; }
  /// The user's optimizer.
  Optimizer& unwrap() const noexcept { return *optimizer_; }
  auto& param_groups() noexcept { return optimizer_->param_groups(); }

  /// Momentum buffers, Adam moments, step counts and param-group hyperparameters.
  StateDict state_dict() const {
    if constexpr (Stateful<Optimizer>) return optimizer_->state_dict();
    else return checkpoint::optimizer_state_dict(*optimizer_);
  }
  void load_state_dict(const StateDict& state) {
    if constexpr (Stateful<Optimizer>) optimizer_->load_state_dict(state);
    else checkpoint::load_optimizer_state_dict(*optimizer_, state);
  }

 private:
  std::shared_ptr<Optimizer> optimizer_;
  [[no_unique_address]] AccRef acc_;
  [[no_unique_address]] AmpSlot amp_;
};

}  // namespace accelerate
