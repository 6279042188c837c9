// The engines behind the Nccl and Zero<Nccl, N> policies: c10d's ProcessGroupNCCL on
// cuda:LOCAL_RANK, with the same rendezvous, reducer, no_sync, collectives and sharding as Gloo. The only header that includes NCCL
// (through ProcessGroupNCCL.hpp); the umbrella header leaves it out.
#pragma once

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/nccl.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <cstdint>
#include <string>

#include <accelerate/detail/check.hpp>
#include <accelerate/distributed/process_group.hpp>
#include <accelerate/distributed/sharded.hpp>

#ifndef USE_C10D_NCCL
#error "accelerate: this LibTorch was built without NCCL (USE_C10D_NCCL is not defined)"
#endif

namespace accelerate::distributed {

/// NCCL: one CUDA device per process, cuda:LOCAL_RANK, made current before any collective.
struct NcclFactory {
  static c10::Device device(const ProcessEnvironment& env, const AcceleratorOptions&) {
    const auto count = static_cast<int>(c10::cuda::device_count());
    ACCELERATE_CHECK(count > 0, "Accelerator<Nccl>: no CUDA device is visible to rank ", env.rank);
    ACCELERATE_CHECK(env.local_rank < count, "Accelerator<Nccl>: rank ", env.rank, " has local rank ",
                     env.local_rank, " but only ", count,
                     " CUDA device(s) are visible on its node (one process per device)");
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.local_rank));
    return {c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank)};
  }

  static compat::BackendPtr create(compat::StorePtr store, const ProcessEnvironment& env,
                                   const AcceleratorOptions& options) {
    device(env, options);  // communicators are made on first use, on the current device
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = options.process_group.timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(std::move(store), env.rank, env.world_size,
                                                       std::move(nccl_options));
  }
};

/// The NCCL version LibTorch was built with, as "major.minor.patch" (no GPU needed).
inline std::string nccl_version() {
  const std::uint64_t code = torch::cuda::nccl::version();  // major << 32 | minor << 16 | patch
  return std::to_string(code >> 32) + "." + std::to_string((code >> 16) & 0xFFFF) + "." +
         std::to_string(code & 0xFFFF) + torch::cuda::nccl::version_suffix();
}

}  // namespace accelerate::distributed

namespace accelerate::detail {

template <>
struct backend_engine<Nccl> {
  using type = distributed::ProcessGroupEngine<distributed::NcclFactory>;
  static_assert(distributed::BackendEngine<type>);
};

template <int Stage>
struct backend_engine<Zero<Nccl, Stage>> {
  using type = distributed::ShardedEngine<distributed::NcclFactory, Stage>;
  static_assert(distributed::BackendEngine<type>);
};

}  // namespace accelerate::detail
