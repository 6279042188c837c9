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
#include <accelerate/distributed/engine.hpp>
#include <accelerate/prepared/preparable.hpp>

namespace accelerate {

/// What prepare() returns for an optimizer. With one process and no policy acting on the step
/// (Accelerator<>) it holds one pointer and step() is the optimizer's step(); otherwise step()
/// follows the policies' step states (step::Context::optimizer_step):
///   - nothing on non-sync micro-steps (zero_grad too), as Accelerate's wrapper;
///   - fp16 gradients unscaled once, clipped (Clip policy), and the step skipped on inf/NaN.
/// Example:
///   auto [opt] = acc.prepare(torch::optim::SGD(model->parameters(), 0.1));
///   opt.step();  opt.zero_grad();
template <class Optimizer, class Acc>
class PreparedOptimizer {
  using Context = typename Acc::context_type;
  static constexpr bool plain = Context::plain_optimizer_step;
  using ContextRef = detail::context_ref<Context, !plain>;
  using Slot = typename Context::optimizer_slot;

 public:
  PreparedOptimizer(std::shared_ptr<Optimizer> optimizer, Context* context, Slot slot)
      : optimizer_(std::move(optimizer)), context_(context), slot_(std::move(slot)) {}

  /// The optimizer step, subject to the policies above.
  void step() {
    if constexpr (plain) optimizer_->step();
    else context_->optimizer_step(*optimizer_, slot_);
  }

  /// The step of an optimizer that re-evaluates the loss, such as torch::optim::LBFGS:
  /// `closure` zeroes the gradients, runs the forward and acc.backward(loss) and returns the
  /// loss; the optimizer calls it as often as it needs, each backward synchronised. Under a
  /// Clip policy every evaluation's gradients are clipped. Not with Fp16 or a sharded Backend
  /// (a compile-time error says why). Returns the first evaluation's loss, undefined off an
  /// accumulation boundary.
  /// Example:
  ///   torch::optim::LBFGS lbfgs(net->parameters(), torch::optim::LBFGSOptions(1));
  ///   auto [model, opt] = acc.prepare(net, lbfgs);
  ///   opt.step([&] { opt.zero_grad(); auto loss = loss_fn(model(x), y); acc.backward(loss); return loss; });
  at::Tensor step(torch::optim::Optimizer::LossClosure closure) {
    if constexpr (plain) return optimizer_->step(std::move(closure));
    else return context_->optimizer_step(*optimizer_, slot_, std::move(closure));
  }

  /// Clears gradients (set to undefined by default, as LibTorch 2.x); a no-op on non-sync
  /// micro-steps so gradients keep accumulating. Under a sharded Backend it clears the model's
  /// local gradients too, so a loop means the same under every Backend.
  void zero_grad(bool set_to_none = true) {
    if constexpr (plain) {
      optimizer_->zero_grad(set_to_none);
    } else {
      if (!context_->sync_gradients()) return;
      distributed::zero_grad(context_->engine, *optimizer_, set_to_none);
    }
  }

  /// True when the last step() was skipped because of an inf/NaN gradient (fp16).
  bool step_was_skipped() const {
    return Context::precision_step::skipped(slot_);
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
  [[no_unique_address]] ContextRef context_;
  [[no_unique_address]] Slot slot_;
};

}  // namespace accelerate
