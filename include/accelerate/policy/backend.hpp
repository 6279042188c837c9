// The Backend slot: where the processes run and how they talk. Concept BackendPolicy and the
// built-in policies SingleProcess, Gloo and Nccl (tags only: the engines live in distributed/).
//
// Customization point: `detail::backend_engine<B>`, specialized next to each engine.
#pragma once

#include <concepts>
#include <string_view>
#include <type_traits>

namespace accelerate {

/// A Backend policy is an empty tag with compile-time facts:
///   - `name`: the policy's name in diagnostics and fingerprints;
///   - `distributed_type`: Accelerate's name for the setup ("NO", "MULTI_CPU", "MULTI_GPU");
///   - `is_distributed`: whether it talks to other processes through c10d;
///   - `requires_cuda`: whether it can only run on a CUDA device.
template <class B>
concept BackendPolicy = std::is_empty_v<B> && requires {
  { B::name } -> std::convertible_to<std::string_view>;
  { B::distributed_type } -> std::convertible_to<std::string_view>;
  { B::is_distributed } -> std::convertible_to<bool>;
  { B::requires_cuda } -> std::convertible_to<bool>;
};

/// One process on the CPU, or on the one visible CUDA device unless AcceleratorOptions::cpu.
/// Collectives are identities and nothing of the distributed engine is instantiated.
/// Example:
///   accelerate::Accelerator<accelerate::SingleProcess> acc;
struct SingleProcess {
  static constexpr std::string_view name = "SingleProcess";
  static constexpr std::string_view distributed_type = "NO";
  static constexpr bool is_distributed = false;
  static constexpr bool requires_cuda = false;
};

/// Data parallel on CPU processes over c10d's ProcessGroupGloo (include
/// <accelerate/distributed/process_group.hpp>, or the umbrella <accelerate/accelerate.hpp>).
/// Example:
///   accelerate::Accelerator<accelerate::Gloo> acc;   // started by accelerate::launch or torchrun
struct Gloo {
  static constexpr std::string_view name = "Gloo";
  static constexpr std::string_view distributed_type = "MULTI_CPU";
  static constexpr bool is_distributed = true;
  static constexpr bool requires_cuda = false;
};

/// Data parallel on CUDA devices, one per process, over c10d's ProcessGroupNCCL (include
/// <accelerate/distributed/nccl.hpp>; the umbrella header leaves it out).
/// Example:
///   accelerate::Accelerator<accelerate::Nccl, accelerate::Bf16> acc;
struct Nccl {
  static constexpr std::string_view name = "Nccl";
  static constexpr std::string_view distributed_type = "MULTI_GPU";
  static constexpr bool is_distributed = true;
  static constexpr bool requires_cuda = true;
};

namespace detail {

template <class B>
inline constexpr bool always_false = false;

/// The engine behind a Backend policy (a distributed::BackendEngine). SingleProcess's is in
/// <accelerate/distributed/local_engine.hpp>; Gloo's and Nccl's in distributed/. The primary
/// template only explains which header is missing.
template <class B>
struct backend_engine {
  static_assert(always_false<B>,
                "accelerate: this Backend policy's engine is not included. For accelerate::Gloo "
                "include <accelerate/distributed/process_group.hpp> (or <accelerate/accelerate.hpp>); "
                "for accelerate::Nccl include <accelerate/distributed/nccl.hpp>.");
};

}  // namespace detail
}  // namespace accelerate
