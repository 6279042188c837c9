// Bodies of torch.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <torch/csrc/autograd/graph_task.h>

#include <accelerate/compat/torch.hpp>

namespace accelerate::compat {

ACCELERATE_INLINE bool autocast_supports(c10::DeviceType device, c10::ScalarType dtype) {
  if (dtype == c10::ScalarType::BFloat16) return true;
  if (dtype != c10::ScalarType::Half) return false;
  if (device == c10::DeviceType::CUDA) return true;
  return TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2);
}

ACCELERATE_INLINE void non_finite_check_and_unscale(std::vector<at::Tensor>& grads, at::Tensor& found_inf,
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

ACCELERATE_INLINE void update_scale(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
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

ACCELERATE_INLINE bool in_backward() { return torch::autograd::get_current_graph_task_id() != -1; }

ACCELERATE_INLINE void fused_adam(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                                   at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs, const at::Tensor& step,
                                   double lr, double beta1, double beta2, double weight_decay, double eps, bool amsgrad,
                                   bool maximize, bool decoupled, const at::Tensor& grad_scale) {
  if (params.empty()) return;
  const std::optional<at::Tensor> scale = grad_scale.defined() ? std::optional<at::Tensor>(grad_scale) : std::nullopt;
  ACCELERATE_CHECK(fused_adam_cpu_kernels || params.front().is_cuda(), "FusedAdam/FusedAdamW: LibTorch ",
                   torch_version, " has no fused Adam kernel for ", params.front().device(),
                   " (CPU kernels arrived in 2.4); use torch::optim::Adam or AdamW");
  const std::vector<at::Tensor> steps(params.size(), step);
  if (decoupled)
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1, beta2, weight_decay, eps,
                      amsgrad, maximize, scale, std::nullopt);
  else
    at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1, beta2, weight_decay, eps,
                     amsgrad, maximize, scale, std::nullopt);
}

ACCELERATE_INLINE std::optional<bool> cpu_huge_pages() {
#if defined(__linux__) && !defined(__ANDROID__) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11))
  return c10::c10_compute_alignment(std::size_t{2} << 20) != c10::gAlignment;
#else
  return std::nullopt;
#endif
}

ACCELERATE_INLINE bool scheduler_follows(const torch::optim::LRScheduler& scheduler, torch::optim::Optimizer& optimizer) {
  auto& groups = optimizer.param_groups();
  std::vector<double> kept;
  std::vector<double> probe;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    kept.push_back(groups[i].options().get_lr());
    probe.push_back(-1e300 - 1e285 * static_cast<double>(i));  // negative: never a real rate
    groups[i].options().set_lr(probe.back());
  }
  const std::vector<double> seen = (scheduler.*detail::SchedulerAccess::current_lrs_member())();
  for (std::size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(kept[i]);
  return seen == probe;
}

ACCELERATE_INLINE PlateauState plateau_state(const torch::optim::ReduceLROnPlateauScheduler& s) {
  using namespace detail;
  return {s.*member_pointer(PlateauLastEpoch{}), s.*member_pointer(PlateauBest{}),
          s.*member_pointer(PlateauBadEpochs{}), s.*member_pointer(PlateauCooldown{})};
}

ACCELERATE_INLINE void set_plateau_state(torch::optim::ReduceLROnPlateauScheduler& s, const PlateauState& state) {
  using namespace detail;
  s.*member_pointer(PlateauLastEpoch{}) = state.last_epoch;
  s.*member_pointer(PlateauBest{}) = state.best;
  s.*member_pointer(PlateauBadEpochs{}) = state.num_bad_epochs;
  s.*member_pointer(PlateauCooldown{}) = state.cooldown_counter;
}

ACCELERATE_INLINE void empty_device_cache() {
  const auto type = at::accelerator::getAccelerator(false);
  if (!type || at::accelerator::deviceCount() == 0) return;
  at::getDeviceAllocator(*type)->emptyCache();
}

ACCELERATE_INLINE void free_storage(const c10::Storage& storage) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(c10::DataPtr(nullptr, impl->device()));
  impl->set_nbytes(std::size_t{0});
}

ACCELERATE_INLINE void allocate_storage(const c10::Storage& storage, std::size_t nbytes) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  if (impl->nbytes() == nbytes && impl->data() != nullptr) return;
  impl->set_data_ptr_noswap(impl->allocator()->allocate(nbytes));
  impl->set_nbytes(nbytes);
}

}  // namespace accelerate::compat
