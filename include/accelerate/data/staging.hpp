// Staging host batches onto an accelerator: a ring of page-locked host buffers, reused from
// batch to batch, and asynchronous copies on a side stream, so a batch's transfer runs while
// the compute stream still works on the previous step and no page-locked memory is allocated
// per batch. Device-generic through c10's stream and event interface (no CUDA header).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <accelerate/data/batch.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate::data {

/// What a DeviceStager needs from a device: page-locked host buffers, a copy that runs
/// asynchronously, and fences (events) the host and the compute stream can wait on.
template <class T>
concept StagingTransfer = requires(T& transfer, const at::Tensor& host, typename T::Fence& fence) {
  { transfer.device() } -> std::convertible_to<c10::Device>;
  { transfer.make_fence() } -> std::same_as<typename T::Fence>;
  { transfer.host_buffer(std::int64_t{}) } -> std::same_as<at::Tensor>;
  { transfer.copy(host) } -> std::same_as<at::Tensor>;
  transfer.record(fence);
  transfer.wait_on_device(fence);
  transfer.wait_on_host(fence);
};

/// The transfer of an accelerator with streams and events (CUDA): copies are issued on a side
/// stream taken from the device's pool, the result is marked as used by the stream that was
/// current when it was made (so the caching allocator does not hand its memory to the side
/// stream while compute still reads it), and the compute stream waits on the fence, not the host.
class StreamTransfer {
 public:
  using Fence = c10::Event;

  explicit StreamTransfer(c10::Device device);

  c10::Device device() const noexcept { return device_; }
  /// The stream the copies run on.
  c10::Stream side_stream() const noexcept { return side_; }

  Fence make_fence() const { return c10::Event(device_.type()); }

  at::Tensor host_buffer(std::int64_t bytes) const;

  at::Tensor copy(const at::Tensor& host) const;

  void record(Fence& fence) const { fence.record(side_); }
  void wait_on_device(const Fence& fence) const { fence.block(guard_.getStream(device_)); }
  void wait_on_host(const Fence& fence) const { fence.synchronize(); }

 private:
  c10::impl::VirtualGuardImpl guard_;
  c10::Device device_;
  c10::Stream side_;
};

/// Moves host batches to a device through `slots` sets of reused page-locked buffers. Each
/// CPU tensor of a batch is copied into its slot's buffer (grown only when a batch needs more
/// bytes than before, so a run of same-shaped batches allocates once per slot), then copied
/// to the device asynchronously; the compute stream waits for the copies, the host does not.
/// Before a slot is written again, the host waits for the copies that read it `slots` batches
/// earlier, normally long finished. Tensors already on the device pass through unchanged.
/// Example:
///   accelerate::data::DeviceStager<> stager(accelerate::data::StreamTransfer({c10::kCUDA, 0}));
///   for (auto& host_batch : batches) train(stager.stage(host_batch));
template <StagingTransfer Transfer = StreamTransfer>
class DeviceStager {
 public:
  explicit DeviceStager(Transfer transfer, std::size_t slots = 2);

  /// `batch` with every tensor on the device; the copies may still be running, but any work
  /// queued afterwards on the current stream of the device sees them complete.
  template <class Batch>
  std::remove_cvref_t<Batch> stage(const Batch& batch) {
    auto& slot = slots_[next_];
    next_ = (next_ + 1) % slots_.size();
    if (slot.in_use) transfer_.wait_on_host(slot.fence);
    std::size_t position = 0;
    std::optional<std::remove_cvref_t<Batch>> staged;
    try {
      staged.emplace(map_tensors(batch, [&](const at::Tensor& t) { return stage_tensor(slot, position, t); }));
    } catch (...) {
      finish(slot);  // copies already issued from this slot are fenced before it is reused
      throw;
    }
    finish(slot);
    return std::move(*staged);
  }

  /// Page-locked buffers allocated so far (one per slot and tensor position, plus one for
  /// each time a batch outgrew a buffer).
  std::size_t host_allocations() const noexcept { return host_allocations_; }
  /// Bytes of page-locked memory held.
  std::int64_t host_bytes() const noexcept;
  const Transfer& transfer() const noexcept { return transfer_; }

 private:
  struct Slot {
    std::vector<at::Tensor> buffers;  // one byte buffer per tensor position of a batch
    typename Transfer::Fence fence;
    bool in_use;
  };

  at::Tensor stage_tensor(Slot& slot, std::size_t& position, const at::Tensor& t);
  void finish(Slot& slot);

  Transfer transfer_;
  std::vector<Slot> slots_;
  std::size_t next_ = 0;
  std::size_t host_allocations_ = 0;
};

// The members of DeviceStager that do not depend on a batch type, defined outside the class:
// not inline, so that the extern template below keeps them out of a trainer's translation unit
// in the separately compiled mode (they are instantiated for StreamTransfer once, in
// staging.ipp).

template <StagingTransfer Transfer>
DeviceStager<Transfer>::DeviceStager(Transfer transfer, std::size_t slots) : transfer_(std::move(transfer)) {
  ACCELERATE_CHECK(slots > 0, "DeviceStager: needs at least one slot of buffers");
  slots_.reserve(slots);
  for (std::size_t s = 0; s < slots; ++s) slots_.push_back(Slot{{}, transfer_.make_fence(), false});
}

template <StagingTransfer Transfer>
std::int64_t DeviceStager<Transfer>::host_bytes() const noexcept {
  std::int64_t bytes = 0;
  for (const auto& slot : slots_)
    for (const auto& buffer : slot.buffers) bytes += buffer.defined() ? buffer.numel() : 0;
  return bytes;
}

template <StagingTransfer Transfer>
at::Tensor DeviceStager<Transfer>::stage_tensor(Slot& slot, std::size_t& position, const at::Tensor& t) {
  const auto device = transfer_.device();
  if (!t.defined() || t.device() == device) return t;
  if (!t.is_cpu() || t.layout() != at::kStrided) return t.to(device);
  if (t.numel() == 0) return at::empty(t.sizes(), t.options().device(device));
  if (position == slot.buffers.size()) slot.buffers.emplace_back();
  auto& buffer = slot.buffers[position++];
  const std::int64_t bytes = t.numel() * static_cast<std::int64_t>(t.element_size());
  if (!buffer.defined() || buffer.numel() < bytes) {
    buffer = at::Tensor();  // the old buffer goes back before the larger one is taken
    buffer = transfer_.host_buffer(bytes);
    ++host_allocations_;
  }
  auto host = buffer.narrow(0, 0, bytes).view(t.scalar_type()).view(t.sizes());
  host.copy_(t);
  return transfer_.copy(host);
}

template <StagingTransfer Transfer>
void DeviceStager<Transfer>::finish(Slot& slot) {
  transfer_.record(slot.fence);
  slot.in_use = true;
  transfer_.wait_on_device(slot.fence);
}

#if defined(ACCELERATE_SEPARATE_COMPILATION)
extern template class DeviceStager<StreamTransfer>;
#endif

}  // namespace accelerate::data

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/data/staging.ipp>
#endif
