// GradScaler: dynamic loss scaling for Fp16, with LibTorch's fused kernels
// (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_) on CPU and CUDA.
#pragma once

#include <map>
#include <tuple>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/compat/torch.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/options.hpp>

namespace accelerate {

/// Per-optimizer scaler bookkeeping within one optimizer step: whether its gradients were
/// already unscaled (unscale happens exactly once, before clipping) and what was found.
struct OptimizerAmpState {
  std::vector<at::Tensor> params;  // the optimizer's parameters, to unscale by ownership
  bool unscaled = false;
  bool skipped = false;            // the last step was skipped for an inf/NaN gradient
  at::Tensor found_inf;            // float32 [1]: > 0 when a gradient had an inf or NaN
};

/// PyTorch's GradScaler semantics: scale(loss) multiplies by the scale; unscale_() divides the
/// gradients and records inf/NaN; update() halves the scale after an overflow and doubles it
/// after `growth_interval` clean steps.
/// Example:
///   accelerate::GradScaler scaler({.init_scale = 1024.0}, torch::kCPU);
///   scaler.scale(loss).backward();
class GradScaler {
 public:
  GradScaler(const GradScalerOptions& options, const c10::Device& device)
      : options_(options),
        scale_(at::full({1}, options.init_scale, at::TensorOptions().dtype(at::kFloat).device(device))),
        growth_tracker_(at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device))) {}

  /// The loss multiplied by the current scale.
  at::Tensor scale(const at::Tensor& loss) const { return loss * scale_.to(loss.device()); }

  /// Divides the gradients of `params` by the scale, once per optimizer step, and records
  /// whether any of them held an inf or NaN in `amp.found_inf`.
  void unscale_(const std::vector<at::Tensor>& params, OptimizerAmpState& amp) const;

  /// Records in `amp.found_inf` whether a gradient of `params` holds an inf or NaN, leaving
  /// them scaled: for an optimizer that divides by scale_tensor() inside its own kernel
  /// (as torch.amp.GradScaler does for fused optimizers).
  void check_(const std::vector<at::Tensor>& params, OptimizerAmpState& amp) const;

  /// The current scale, a float32 [1] tensor on the scaler's device.
  const at::Tensor& scale_tensor() const noexcept { return scale_; }

  /// Adjusts the scale after an optimizer step (skipped or not).
  void update(const at::Tensor& found_inf);

  /// The current scale.
  double get_scale() const { return scale_.item<double>(); }
  /// Clean steps since the last change of scale.
  int64_t growth_tracker() const { return growth_tracker_.item<int64_t>(); }
  const GradScalerOptions& options() const noexcept { return options_; }

  StateDict state_dict() const;

  void load_state_dict(const StateDict& s);

 private:
  // Multiplies the gradients by `inv_scale` (1: only checks) and records inf/NaN.
  void check_and_multiply(const std::vector<at::Tensor>& params, OptimizerAmpState& amp, const at::Tensor& inv_scale) const;

  GradScalerOptions options_;
  at::Tensor scale_;
  at::Tensor growth_tracker_;
};

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/amp/grad_scaler.ipp>
#endif
