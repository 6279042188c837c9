// The engine behind SingleProcess: one process, collectives are identities, nothing to sync.
// An empty type (tests/static/zero_cost.cpp): a one-process Accelerator pays for no engine.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>

#include <accelerate/distributed/engine.hpp>
#include <accelerate/distributed/reduction.hpp>
#include <accelerate/distributed/stats.hpp>
#include <accelerate/options.hpp>
#include <accelerate/policy/backend.hpp>

namespace accelerate::distributed {

/// What a prepared model keeps for gradient synchronisation with one process: nothing.
struct NoModelSync {
  static constexpr void set_sync(bool) noexcept {}
  static constexpr bool sync_enabled() noexcept { return true; }
};

/// Engine of SingleProcess: rank 0 of 1; each collective leaves its input as it is (a
/// reduce_scatter's one slice is the whole tensor).
/// Example:
///   accelerate::distributed::LocalEngine engine({}, "");  engine.world_size();  // 1
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
  static c10::Device collective_device() noexcept { return {c10::kCPU}; }

  static constexpr void barrier() noexcept {}
  static void all_reduce(at::Tensor&, Reduction) noexcept {}
  static void broadcast(at::Tensor&, int) noexcept {}
  static std::vector<at::Tensor> all_gather(const at::Tensor& tensor) { return {tensor}; }
  static at::Tensor reduce_scatter(const at::Tensor& tensor, Reduction) { return tensor.clone(); }
  static constexpr CommStats stats() noexcept { return {}; }
  static void check_same_on_every_rank(const std::string&, const std::string&, const std::string&) noexcept {}

  static NoModelSync make_model_sync(torch::nn::Module&, const std::string& /*model name*/,
                                     const AcceleratorOptions&) {
    return {};
  }
};

static_assert(BackendEngine<LocalEngine>);

}  // namespace accelerate::distributed

namespace accelerate::detail {

template <>
struct backend_engine<SingleProcess> {
  using type = distributed::LocalEngine;
};

}  // namespace accelerate::detail
