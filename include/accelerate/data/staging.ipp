// Bodies of staging.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/data/staging.hpp>

namespace accelerate::data {

ACCELERATE_INLINE StreamTransfer::StreamTransfer(c10::Device device)
    : guard_(device.type()),
      device_(device.has_index() ? device : c10::Device(device.type(), guard_.getDevice().index())),
      side_(guard_.getStreamFromGlobalPool(device_)) {}

ACCELERATE_INLINE at::Tensor StreamTransfer::host_buffer(std::int64_t bytes) const {
  return at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
}

ACCELERATE_INLINE at::Tensor StreamTransfer::copy(const at::Tensor& host) const {
  const auto compute = guard_.getStream(device_);
  at::Tensor out;
  {
    c10::StreamGuard on_side(side_);
    out = host.to(device_, /*non_blocking=*/true);
  }
  out.record_stream(compute);
  return out;
}

#if defined(ACCELERATE_SEPARATE_COMPILATION)
// The stager every prepared loader uses on CUDA, compiled once (staging.hpp declares it extern).
template class DeviceStager<StreamTransfer>;
#endif

}  // namespace accelerate::data
