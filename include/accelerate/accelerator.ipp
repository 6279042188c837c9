// Bodies of accelerator.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <mutex>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>

#include <accelerate/accelerator.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE void refuse_nonfinite_loss(const at::Tensor& loss, std::uint64_t call,
                                             std::optional<std::size_t> micro_step, int rank, int world_size) {
  if (at::isfinite(loss.detach()).all().item<bool>()) return;
  std::ostringstream where;
  where << "backward call " << call << " since this Accelerator was created";
  if (micro_step) where << " (micro-step " << *micro_step << " of the accumulation)";
  const at::Tensor values = loss.detach().flatten();
  const at::Tensor bad = values.masked_select(at::isfinite(values).logical_not());
  fail("backward: the loss is ", bad[0].item<double>(), " at ", where.str(), " on rank ", rank, " of ", world_size,
       "; no gradient was computed and no parameter changed "
       "(AcceleratorOptions::check_finite_loss). Lower the learning rate or check "
       "this step's batch");
}

ACCELERATE_INLINE std::uint64_t draw_random_seed() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get<at::CPUGeneratorImpl>()->random64() >> 1;
}

}  // namespace accelerate::detail
