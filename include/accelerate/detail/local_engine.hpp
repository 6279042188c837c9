// The engine behind SingleProcess: one process, collectives are identities, nothing to sync.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>

#include <accelerate/distributed/stats.hpp>
#include <accelerate/options.hpp>
#include <accelerate/policy/backend.hpp>

namespace accelerate::detail {

/// What a prepared model keeps for gradient synchronisation with one process: nothing.
struct NoModelSync {
  static constexpr void set_sync(bool) noexcept {}
  static constexpr bool sync_enabled() noexcept { return true; }
};

/// Engine of SingleProcess. Empty: rank 0 of 1, every collective returns its input.
struct LocalEngine {
  static constexpr bool distributed = false;
  using ModelSync = NoModelSync;

  LocalEngine(const AcceleratorOptions&, std::string_view /*config fingerprint*/) {}

  static constexpr int rank() noexcept { return 0; }
  static constexpr int world_size() noexcept { return 1; }
  static constexpr int local_rank() noexcept { return 0; }
  static constexpr int local_world_size() noexcept { return 1; }

  /// The one visible CUDA device unless asked for the CPU.
  static c10::Device device(const AcceleratorOptions& options) {
    if (!options.cpu && torch::cuda::is_available()) return {c10::kCUDA, 0};
    return {c10::kCPU};
  }

  static constexpr void barrier() noexcept {}
  static constexpr CommStats stats() noexcept { return {}; }

  static NoModelSync make_model_sync(torch::nn::Module&, const std::string& /*model name*/,
                                     const AcceleratorOptions&) {
    return {};
  }
};

template <>
struct backend_engine<SingleProcess> {
  using type = LocalEngine;
};

}  // namespace accelerate::detail
