// The only place (with compat/c10d.hpp) that knows one LibTorch 2.x release from another:
// autocast entry points, the fused AMP kernels, and scheduler internals we must save.
#pragma once

#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/version.h>

#include <accelerate/detail/check.hpp>

namespace accelerate::compat {

/// LibTorch as "major.minor.patch".
inline constexpr const char* torch_version = TORCH_VERSION;

// --- autocast ----------------------------------------------------------------------------
// 2.4 added the device-generic set_autocast_enabled(DeviceType, bool) family; the old
// per-device names are deprecated there and warn at run time.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline bool autocast_enabled(c10::DeviceType device) {
  return at::autocast::is_autocast_enabled(device);
}
inline void set_autocast_enabled(c10::DeviceType device, bool enabled) {
  at::autocast::set_autocast_enabled(device, enabled);
}
inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
  return at::autocast::get_autocast_dtype(device);
}
inline void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
  at::autocast::set_autocast_dtype(device, dtype);
}
#else
inline bool autocast_enabled(c10::DeviceType device) {
  return device == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                         : at::autocast::is_cpu_enabled();
}
inline void set_autocast_enabled(c10::DeviceType device, bool enabled) {
  if (device == c10::DeviceType::CUDA) at::autocast::set_enabled(enabled);
  else at::autocast::set_cpu_enabled(enabled);
}
inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
  return device == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                         : at::autocast::get_autocast_cpu_dtype();
}
inline void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
  if (device == c10::DeviceType::CUDA) at::autocast::set_autocast_gpu_dtype(dtype);
  else at::autocast::set_autocast_cpu_dtype(dtype);
}
#endif

/// Whether autocast on `device` computes in `dtype`: CUDA does half and bfloat16; the CPU
/// bfloat16 and, since 2.2, half. LibTorch's C++ setters do not check this themselves.
inline bool autocast_supports(c10::DeviceType device, c10::ScalarType dtype) {
  if (dtype == c10::ScalarType::BFloat16) return true;
  if (dtype != c10::ScalarType::Half) return false;
  if (device == c10::DeviceType::CUDA) return true;
  return TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2);
}

inline int autocast_increment_nesting() { return at::autocast::increment_nesting(); }
inline int autocast_decrement_nesting() { return at::autocast::decrement_nesting(); }
inline void autocast_clear_cache() { at::autocast::clear_cache(); }

// --- fused AMP kernels -------------------------------------------------------------------
// CUDA has had them since 1.x; CPU kernels arrived in 2.3. Older CPU builds use the
// composite fallback below (same arithmetic, several kernels).
inline constexpr bool amp_cpu_kernels =
    TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3);

/// Multiplies every gradient by inv_scale and sets found_inf to 1 if any element was inf/NaN.
/// All tensors share one device; grads share one dtype.
inline void non_finite_check_and_unscale(std::vector<at::Tensor>& grads, at::Tensor& found_inf,
                                         const at::Tensor& inv_scale) {
  if (grads.empty()) return;
  if (amp_cpu_kernels || grads.front().is_cuda()) {
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    return;
  }
  for (auto& g : grads) {
    found_inf.add_(g.isfinite().logical_not().any().to(found_inf.dtype())).clamp_max_(1);
    g.mul_(inv_scale);
  }
}

/// PyTorch's GradScaler update rule in place on `scale` and `growth_tracker`.
inline void update_scale(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                         double growth_factor, double backoff_factor, int64_t growth_interval) {
  if (amp_cpu_kernels || scale.is_cuda()) {
    at::_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                           growth_interval);
    return;
  }
  if (found_inf.item<float>() > 0) {
    scale.mul_(backoff_factor);
    growth_tracker.zero_();
  } else {
    growth_tracker.add_(1);
    if (growth_tracker.item<int64_t>() == growth_interval) {
      scale.mul_(growth_factor);
      growth_tracker.zero_();
    }
  }
}

// --- schedulers --------------------------------------------------------------------------
// LRScheduler keeps its step count in a protected member; it is the scheduler's whole state
// (the learning rates live in the optimizer). A pointer to member named through a derived
// class is the standard way to reach it without changing LibTorch.
}  // namespace accelerate::compat

namespace accelerate::detail {
struct SchedulerAccess : torch::optim::LRScheduler {
  static auto step_count_member() { return &SchedulerAccess::step_count_; }
};
}  // namespace accelerate::detail

namespace accelerate::compat {

/// The scheduler's number of steps taken.
inline unsigned scheduler_step_count(const torch::optim::LRScheduler& scheduler) {
  return scheduler.*detail::SchedulerAccess::step_count_member();
}

/// Restores the scheduler's number of steps taken.
inline void set_scheduler_step_count(torch::optim::LRScheduler& scheduler, unsigned count) {
  scheduler.*detail::SchedulerAccess::step_count_member() = count;
}

}  // namespace accelerate::compat
