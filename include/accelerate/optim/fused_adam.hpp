// FusedAdam and FusedAdamW: torch::optim's Adam and AdamW, each step one ATen kernel per
// device and dtype (_fused_adam_/_fused_adamw_) instead of about eight kernels per parameter.
// Same options, same state type, same checkpoint; bench/README.md ("Fused optimizers") has the
// measured speed-up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <accelerate/detail/linkage.hpp>

namespace accelerate {

/// What FusedAdam and FusedAdamW add to torch::optim's options.
struct FusedAdamOptions {
  /// Ascend the objective instead of descending it (PyTorch's `maximize`).
  bool maximize = false;
  /// The dtype the moments are kept in between steps; unset: the parameter's, as torch::optim.
  /// at::kBFloat16 halves their memory under fp32 parameters; each step then computes on an
  /// fp32 copy of at most `chunk_elements` moments at a time.
  std::optional<at::ScalarType> moments_dtype;
  /// The largest number of moment elements copied to the parameter's dtype at once (only with
  /// a `moments_dtype` other than the parameter's).
  std::int64_t chunk_elements = std::int64_t{1} << 24;
};

namespace detail {

/// One param group's tensors as a fused Adam step reads them: slot i of every list is
/// parameter i (max_exp_avg_sqs empty without amsgrad); `steps` are the counts after this step.
struct AdamStepTensors {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<std::int64_t> steps;
};

/// A param group's hyperparameters; `decoupled`: AdamW's weight decay (p *= 1 - lr * wd)
/// rather than Adam's L2 term (g += wd * p).
struct AdamHyperparameters {
  double lr, beta1, beta2, weight_decay, eps;
  bool amsgrad, maximize, decoupled;
};

/// Runs the fused kernel over `tensors`, one call per device, dtype and step count; gradients
/// are divided by `grad_scale` inside the kernel when it is defined (a GradScaler's scale).
void fused_adam_step(const AdamStepTensors& tensors, const AdamHyperparameters& hyper, const FusedAdamOptions& fused,
                     const at::Tensor& grad_scale);

/// What FusedAdam and FusedAdamW share: gathering a group's tensors, creating the state as
/// torch::optim does (so a checkpoint of one loads into the other), and the pending scale.
template <class Base, class Options, class State, bool Decoupled>
class FusedAdamBase : public Base {
 public:
  FusedAdamBase(std::vector<torch::optim::OptimizerParamGroup> groups, Options defaults, FusedAdamOptions fused)
      : Base(std::move(groups), std::move(defaults)), fused_(fused) {}
  FusedAdamBase(std::vector<at::Tensor> params, Options defaults, FusedAdamOptions fused)
      : Base(std::move(params), std::move(defaults)), fused_(fused) {}

  /// One step of every parameter that has a gradient. `closure`, when given, is called first
  /// with autograd on and its loss returned.
  at::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override {
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    at::NoGradGuard no_grad;
    const at::Tensor grad_scale = std::exchange(grad_scale_, at::Tensor());
    for (auto& group : this->param_groups()) {
      const auto& options = static_cast<const Options&>(group.options());
      AdamStepTensors tensors;
      for (const at::Tensor& param : group.params()) {
        if (!param.grad().defined()) continue;
        State& state = state_of(param, options.amsgrad());
        state.step(state.step() + 1);
        tensors.params.push_back(param);
        tensors.grads.push_back(param.grad());
        tensors.exp_avgs.push_back(state.exp_avg());
        tensors.exp_avg_sqs.push_back(state.exp_avg_sq());
        if (options.amsgrad()) tensors.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
        tensors.steps.push_back(state.step());
      }
      if (tensors.params.empty()) continue;
      fused_adam_step(tensors,
                      {options.lr(), std::get<0>(options.betas()), std::get<1>(options.betas()), options.weight_decay(),
                       options.eps(), options.amsgrad(), fused_.maximize, Decoupled},
                      fused_, grad_scale);
    }
    return loss;
  }

  /// The next step() divides every gradient by `scale` inside its kernel: a GradScaler's
  /// unscale folded into the step (the Fp16 policy does this when nothing clips). Once only.
  void unscale_in_next_step(at::Tensor scale) { grad_scale_ = std::move(scale); }

  const FusedAdamOptions& fused_options() const noexcept { return fused_; }

 private:
  // The parameter's state, made as torch::optim makes it on a first step (zeros, step 0), in
  // the moments' dtype; a loaded state of another dtype (a checkpoint of torch::optim's, or one
  // with other moments_dtype) is converted once.
  State& state_of(const at::Tensor& param, bool amsgrad) {
    auto& states = this->state();
    auto found = states.find(param.unsafeGetTensorImpl());
    const at::ScalarType dtype = fused_.moments_dtype.value_or(param.scalar_type());
    const auto zeros = [&] { return at::zeros_like(param, at::TensorOptions().dtype(dtype), at::MemoryFormat::Preserve); };
    if (found == states.end()) {
      auto made = std::make_unique<State>();
      made->step(0);
      made->exp_avg(zeros());
      made->exp_avg_sq(zeros());
      if (amsgrad) made->max_exp_avg_sq(zeros());
      found = states.emplace(param.unsafeGetTensorImpl(), std::move(made)).first;
    }
    State& state = static_cast<State&>(*found->second);
    if (state.exp_avg().scalar_type() != dtype) {
      state.exp_avg(state.exp_avg().to(dtype));
      state.exp_avg_sq(state.exp_avg_sq().to(dtype));
    }
    if (amsgrad && !state.max_exp_avg_sq().defined()) state.max_exp_avg_sq(zeros());
    else if (amsgrad && state.max_exp_avg_sq().scalar_type() != dtype) state.max_exp_avg_sq(state.max_exp_avg_sq().to(dtype));
    return state;
  }

  FusedAdamOptions fused_;
  at::Tensor grad_scale_;  // set by unscale_in_next_step, consumed by step()
};

}  // namespace detail

/// torch::optim::AdamW (decoupled weight decay) stepping through ATen's fused kernel: the same
/// update to within float rounding (1e-6 over 100 steps, every option), the same
/// torch::optim::AdamWParamState, so state_dicts and checkpoints move between the two either
/// way; `maximize` and moments kept in bf16 are FusedAdamOptions. Preparable like any
/// optimizer, including under ZeRO (it steps the rank's slices) and Fp16 (see
/// unscale_in_next_step).
/// Example:
///   accelerate::FusedAdamW adamw(net->parameters(), torch::optim::AdamWOptions(3e-4).weight_decay(0.1));
///   auto [model, opt] = acc.prepare(net, adamw);
class FusedAdamW final
    : public detail::FusedAdamBase<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState, true> {
 public:
  explicit FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> groups,
                      torch::optim::AdamWOptions defaults = torch::optim::AdamWOptions(), FusedAdamOptions fused = {})
      : FusedAdamBase(std::move(groups), std::move(defaults), fused) {}
  explicit FusedAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults = torch::optim::AdamWOptions(),
                      FusedAdamOptions fused = {})
      : FusedAdamBase(std::move(params), std::move(defaults), fused) {}
};

/// torch::optim::Adam (L2 weight decay added to the gradient) through ATen's fused kernel; as
/// FusedAdamW otherwise.
/// Example:
///   accelerate::FusedAdam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
class FusedAdam final
    : public detail::FusedAdamBase<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState, false> {
 public:
  explicit FusedAdam(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamOptions defaults = torch::optim::AdamOptions(),
                     FusedAdamOptions fused = {})
      : FusedAdamBase(std::move(groups), std::move(defaults), fused) {}
  explicit FusedAdam(std::vector<at::Tensor> params, torch::optim::AdamOptions defaults = torch::optim::AdamOptions(),
                     FusedAdamOptions fused = {})
      : FusedAdamBase(std::move(params), std::move(defaults), fused) {}
};

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/optim/fused_adam.ipp>
#endif
