// The only place (with compat/c10d.hpp) that knows one LibTorch 2.x release from another:
// autocast entry points, the fused AMP and Adam kernels, the CPU allocator's huge pages, and scheduler
// internals we must save.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/alignment.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/ScalarType.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/optim/schedulers/reduce_on_plateau_scheduler.h>
#include <torch/version.h>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

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
bool autocast_supports(c10::DeviceType device, c10::ScalarType dtype);

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
void non_finite_check_and_unscale(std::vector<at::Tensor>& grads, at::Tensor& found_inf,
                                  const at::Tensor& inv_scale);

/// PyTorch's GradScaler update rule in place on `scale` and `growth_tracker`.
void update_scale(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                  double growth_factor, double backoff_factor, int64_t growth_interval);

// --- autograd ----------------------------------------------------------------------------
/// Whether this thread is running a backward pass now (a node's apply, a hook): the engine's
/// current graph task, an internal of torch/csrc/autograd (graph_task.h) since 1.x.
bool in_backward();

// --- fused Adam kernels ------------------------------------------------------------------
// _fused_adam_/_fused_adamw_ have had CUDA kernels since 2.0 and CPU kernels since 2.4; on an
// older CPU build the fused optimizers are refused with that reason.
inline constexpr bool fused_adam_cpu_kernels =
    TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4);

/// One Adam (decoupled: AdamW) step of tensors sharing one device and dtype, the moments in
/// that dtype, every parameter at step count `step` (a float32 scalar on their device, already
/// incremented). `grad_scale`, when defined, divides the gradients first.
void fused_adam(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                at::TensorList max_exp_avg_sqs, const at::Tensor& step, double lr, double beta1, double beta2,
                double weight_decay, double eps, bool amsgrad, bool maximize, bool decoupled,
                const at::Tensor& grad_scale);

// --- CPU buffers on transparent huge pages ------------------------------------------------
// LibTorch's CPU allocator asks the kernel for huge pages (madvise MADV_HUGEPAGE, 2 MB each)
// for buffers of 2 MB and more when THP_MEM_ALLOC_ENABLE=1; it reads the variable once, at the
// process's first CPU allocation, and then aligns those buffers to the page size instead of 64
// bytes. Read from the allocator itself in 2.11; older releases report "unknown".
#if defined(__linux__) && !defined(__ANDROID__)
/// Sets THP_MEM_ALLOC_ENABLE=1 unless the environment already says something. It takes effect
/// only if this process has not allocated a CPU tensor yet; like any setenv, call it before
/// other threads read the environment.
inline void request_cpu_huge_pages() noexcept { ::setenv("THP_MEM_ALLOC_ENABLE", "1", /*overwrite=*/0); }
#else
inline void request_cpu_huge_pages() noexcept {}
#endif

/// Whether LibTorch backs this process's large CPU buffers with huge pages; nullopt where this
/// release does not say.
std::optional<bool> cpu_huge_pages();

// --- schedulers --------------------------------------------------------------------------
// LRScheduler keeps its step count in a protected member; it is the scheduler's whole state
// (the learning rates live in the optimizer). A pointer to member named through a derived
// class is the standard way to reach it without changing LibTorch.
}  // namespace accelerate::compat

namespace accelerate::detail {
struct SchedulerAccess : torch::optim::LRScheduler {
  static auto step_count_member() { return &SchedulerAccess::step_count_; }
  static auto current_lrs_member() { return &SchedulerAccess::get_current_lrs; }
};

// ReduceLROnPlateauScheduler keeps everything step() changes private, with no accessor, and
// its learning-rate reductions depend on it: a resumed run that lost it would wait `patience`
// evaluations from scratch. C++20 does not check access in the template arguments of an
// explicit specialization ([temp.spec.general]), so naming a member there instantiates
// MemberOf, whose friend hands the member pointer out. Checked against 2.11's layout of names
// by tests/unit/prepared/scheduler_test.cpp (a renamed member does not compile).
template <class Tag, auto Member>
struct MemberOf {
  friend constexpr auto member_pointer(Tag) noexcept { return Member; }
};
template <class Tag, std::size_t>
struct Instantiate {};
#define ACCELERATE_PRIVATE_MEMBER(TAG, CLASS, NAME)                    \
  struct TAG {                                                          \
    friend constexpr auto member_pointer(TAG) noexcept;                 \
  };                                                                    \
  template <>                                                           \
  struct Instantiate<TAG, sizeof(MemberOf<TAG, &CLASS::NAME>)> {}
ACCELERATE_PRIVATE_MEMBER(PlateauLastEpoch, torch::optim::ReduceLROnPlateauScheduler, last_epoch);
ACCELERATE_PRIVATE_MEMBER(PlateauBest, torch::optim::ReduceLROnPlateauScheduler, best);
ACCELERATE_PRIVATE_MEMBER(PlateauBadEpochs, torch::optim::ReduceLROnPlateauScheduler, num_bad_epochs);
ACCELERATE_PRIVATE_MEMBER(PlateauCooldown, torch::optim::ReduceLROnPlateauScheduler, cooldown_counter);
#undef ACCELERATE_PRIVATE_MEMBER
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

/// Whether `scheduler` sets the learning rates of `optimizer`. LRScheduler holds its optimizer
/// privately, so this asks: it gives the optimizer's param groups learning rates no schedule
/// produces, reads them back through the scheduler, and restores them.
bool scheduler_follows(const torch::optim::LRScheduler& scheduler, torch::optim::Optimizer& optimizer);

/// What ReduceLROnPlateauScheduler::step() changes: its evaluation count, the best metric so
/// far, the evaluations since it improved, and the remaining cooldown.
struct PlateauState {
  int last_epoch = 0;
  float best = 0;
  int num_bad_epochs = 0;
  int cooldown_counter = 0;
};

PlateauState plateau_state(const torch::optim::ReduceLROnPlateauScheduler& s);

void set_plateau_state(torch::optim::ReduceLROnPlateauScheduler& s, const PlateauState& state);

// --- device memory -----------------------------------------------------------------------
// Through the accelerator-generic DeviceAllocator of LibTorch 2.11 (ATen/DeviceAccelerator.h),
// so CUDA, XPU and the rest need no branch here.

/// Returns the cached, unused blocks of the accelerator's caching allocator to the device (a
/// no-op without an accelerator, or with a CUDA build on a machine without a GPU).
void empty_device_cache();

/// Frees a storage's memory in place: every tensor viewing it keeps its shape but has no data
/// until allocate_storage (ZeRO stage 3's released parameters; FSDP resizes storages the same
/// way). StorageImpl's data-pointer setters are public in 2.x but not a documented API.
void free_storage(const c10::Storage& storage);

/// Gives a storage freed by free_storage `nbytes` of fresh memory from its own allocator, in
/// place, so the tensors (and autograd's saved views) that share it see the new memory.
void allocate_storage(const c10::Storage& storage, std::size_t nbytes);

}  // namespace accelerate::compat

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/compat/torch.ipp>
#endif
