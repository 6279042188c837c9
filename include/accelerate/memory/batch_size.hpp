// find_executable_batch_size: retry a training function with half the batch size while it runs
// out of memory, every process agreeing on the size (Accelerate's utils.memory).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <accelerate/compat/torch.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/distributed/engine.hpp>

namespace accelerate::memory {

/// Whether `error` means an allocation failed: std::bad_alloc, c10::OutOfMemoryError (CUDA's
/// caching allocator), or one of the messages Accelerate's should_reduce_batch_size knows
/// (LibTorch's CPU allocator throws a plain c10::Error "DefaultCPUAllocator: can't allocate
/// memory"; cuDNN reports a too-large workspace as CUDNN_STATUS_NOT_SUPPORTED).
inline bool is_out_of_memory(const std::exception& error) {
  if (dynamic_cast<const std::bad_alloc*>(&error) || dynamic_cast<const c10::OutOfMemoryError*>(&error)) return true;
  const std::string_view text = error.what();
  for (const std::string_view marker : {"CUDA out of memory.", "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
                                        "DefaultCPUAllocator: can't allocate memory", "out of memory"})
    if (text.find(marker) != std::string_view::npos) return true;
  return false;
}

/// Calls `train(batch_size)` from `starting_batch_size`; while it runs out of memory
/// (is_out_of_memory) the device cache is emptied and it is called again with the size halved,
/// until it returns — whose result this returns — or the size reaches 0 (an accelerate::Error).
/// Any other exception propagates unchanged.
///
/// With several processes every attempt ends with one all-reduce of "did it run out", so all
/// retry together at the same size even when only one ran out (the others' results at that
/// size are discarded). They must leave `train` at the same collective: an allocation that
/// fails in the forward or backward before the gradients are exchanged, as it does when every
/// rank's batches have the same shapes. A rank that fails while the others wait in a
/// collective leaves them waiting until ProcessGroupOptions::timeout.
///
/// `train` builds what depends on the batch size (the dataloader, prepared anew) and should
/// not keep tensors of a failed attempt alive; models and optimizers can outlive attempts.
/// Example:
///   acc.find_executable_batch_size([&](std::int64_t batch_size) {
///     auto [loader] = acc.prepare(accelerate::DataLoader(data, {.batch_size = std::size_t(batch_size)}));
///     for (auto& [x, y] : loader) { ... }
///   }, 128);
template <distributed::BackendEngine E, class Train>
std::invoke_result_t<Train&, std::int64_t> find_executable_batch_size(E& engine, Train&& train,
                                                                      std::int64_t starting_batch_size) {
  ACCELERATE_CHECK(starting_batch_size > 0, "find_executable_batch_size: the starting batch size must be > 0, got ",
                   starting_batch_size);
  using Result = std::invoke_result_t<Train&, std::int64_t>;
  // Every rank leaves the loop together: only when no rank ran out at this size.
  const auto anyone_ran_out = [&engine](bool mine) {
    if constexpr (!E::distributed) {
      return mine;
    } else {
      at::Tensor flag = at::full({1}, mine ? 1.0 : 0.0, at::kFloat).to(engine.collective_device());
      engine.all_reduce(flag, Reduction::max);
      return flag.item<float>() > 0;
    }
  };
  std::string last_error;
  for (std::int64_t batch_size = starting_batch_size; batch_size > 0; batch_size /= 2) {
    bool ran_out = false;
    if constexpr (std::is_void_v<Result>) {
      try {
        std::invoke(train, batch_size);
      } catch (const std::exception& e) {
        if (!is_out_of_memory(e)) throw;
        ran_out = true;
        last_error = e.what();
      }
      if (!anyone_ran_out(ran_out)) return;
    } else {
      std::optional<Result> result;
      try {
        result.emplace(std::invoke(train, batch_size));
      } catch (const std::exception& e) {
        if (!is_out_of_memory(e)) throw;
        ran_out = true;
        last_error = e.what();
      }
      if (!anyone_ran_out(ran_out)) return std::move(*result);
    }
    compat::empty_device_cache();
  }
  accelerate::detail::fail("find_executable_batch_size: no executable batch size found, reached zero from ",
                           starting_batch_size, last_error.empty() ? "" : "; this rank's last error: ",
                           last_error.substr(0, last_error.find('\n')));
}

}  // namespace accelerate::memory

namespace accelerate {
using memory::find_executable_batch_size;
using memory::is_out_of_memory;
}  // namespace accelerate
