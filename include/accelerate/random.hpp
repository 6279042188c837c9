// Seeding and RNG state: set_seed, and capture/restore of the CPU and CUDA generators for
// exact resume.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/cuda.h>

namespace accelerate {

/// Seeds torch's CPU generator and every CUDA device's generator. With device_specific, the
/// process index is added so ranks draw different numbers (Accelerate's set_seed).
/// Example:
///   accelerate::set_seed(42);
inline void set_seed(std::uint64_t seed, bool device_specific = false, std::size_t process_index = 0) {
  const std::uint64_t value = device_specific ? seed + process_index : seed;
  at::manual_seed(value);  // CPU and, where initialised, all CUDA generators
}

namespace detail {

/// The generators that save_state records: CPU, then one per visible CUDA device.
inline std::vector<at::Generator> all_generators() {
  std::vector<at::Generator> generators{at::detail::getDefaultCPUGenerator()};
  if (torch::cuda::is_available()) {
    const auto n = static_cast<c10::DeviceIndex>(torch::cuda::device_count());
    for (c10::DeviceIndex i = 0; i < n; ++i)
      generators.push_back(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, i)));
  }
  return generators;
}

}  // namespace detail
}  // namespace accelerate
