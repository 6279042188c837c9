// The Backend slot: where the processes run and how they talk. Concept BackendPolicy and the
// built-in policies SingleProcess, Gloo, Nccl and the sharded Zero<Transport, Stage> (tags
// only: the engines live in distributed/).
//
// Customization point: `detail::backend_engine<B>`, specialized next to each engine.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include <accelerate/run_config.hpp>

namespace accelerate {

/// A Backend policy is an empty tag with compile-time facts:
///   - `name`: the policy's name in diagnostics and fingerprints;
///   - `distributed_type`: Accelerate's name for the setup ("NO", "MULTI_CPU", "MULTI_GPU");
///   - `is_distributed`: whether it talks to other processes through c10d;
///   - `requires_cuda`: whether it can only run on a CUDA device;
///   - optionally `static bool selected_by(const RunConfig&)`: whether a run-time configuration
///     selects it (dispatch()). Without it: when the configuration's distributed_type is
///     `distributed_type`, it asks for one process unless `is_distributed`, and no ZeRO stage.
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

/// "Zero<Gloo,2>": the spelling of a Zero policy's name, built at compile time.
template <class Transport, int Stage>
struct zero_spelling {
  static constexpr std::string_view head = "Zero<";
  static constexpr auto text = [] {
    std::array<char, head.size() + Transport::name.size() + 3> out{};
    std::size_t i = 0;
    for (char c : head) out[i++] = c;
    for (char c : Transport::name) out[i++] = c;
    out[i++] = ',';
    out[i++] = static_cast<char>('0' + Stage);
    out[i++] = '>';
    return out;
  }();
};

}  // namespace detail

/// Sharded data parallel, as ZeRO (and Python Accelerate's DeepSpeed / FSDP plugins), over
/// `Transport`'s process group (Gloo or Nccl), chosen by stage:
///   - Zero<T, 1>: optimizer state sharded. Gradients are averaged as with data parallel, then
///     each rank keeps and steps only its 1/world_size of the parameters (each gradient bucket
///     flattened, padded to divide evenly, rank r owning the r-th slice) and the updated
///     slices are all-gathered. Adam in fp32 holds 4+4+8/W bytes per parameter.
///   - Zero<T, 2>: gradients sharded too: each bucket is reduce-scattered from the autograd
///     hooks while backward runs, so a rank keeps only its shard's gradients: 4+12/W bytes.
///   - Zero<T, 3>: parameters sharded too: 16/W bytes between steps. A unit's parameters are
///     all-gathered just before its forward and again for its backward, and freed after; the
///     units are the children of a torch::nn::Sequential model (the next one's all-gather
///     overlaps the current one's compute), or else the whole model. Between steps the
///     model's parameters are empty tensors: read them with acc.get_state_dict(model).
/// The prepared optimizer's param groups hold this rank's slices (1-D views of the model's
/// parameters, or of the rank's parameter shard at stage 3); after a synchronised backward
/// the gradients live there, not on the model's parameters. Element-wise optimizers only (SGD, Adam, AdamW, RMSprop, Adagrad). Every other
/// policy, accumulation, clipping, checkpoints and save_model work as with Gloo/Nccl; see
/// docs/sharding.md. Include <accelerate/distributed/sharded.hpp> (opt-in: the umbrella
/// header leaves it out, as it does NCCL) or, for Nccl, <accelerate/distributed/nccl.hpp>.
/// Example:
///   accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 2>, accelerate::Fp32, accelerate::Accumulate<4>> acc;
template <class Transport, int Stage>
struct Zero {
  static_assert(std::is_same_v<Transport, Gloo> || std::is_same_v<Transport, Nccl>,
                "accelerate::Zero<Transport, Stage>: Transport is accelerate::Gloo or accelerate::Nccl");
  static_assert(Stage >= 1 && Stage <= 3,
                "accelerate::Zero<Transport, Stage>: stage 1 (optimizer state), 2 (and gradients) "
                "or 3 (and parameters)");
  using transport = Transport;
  static constexpr int stage = Stage;
  static constexpr std::string_view name{detail::zero_spelling<Transport, Stage>::text.data(),
                                         detail::zero_spelling<Transport, Stage>::text.size()};
  static constexpr std::string_view distributed_type = Transport::distributed_type;
  static constexpr bool is_distributed = true;
  static constexpr bool requires_cuda = Transport::requires_cuda;
  /// Selected by the transport's distributed_type with `zero_stage` = Stage (Accelerate's
  /// deepspeed_config.zero_stage, or ACCELERATE_DEEPSPEED_ZERO_STAGE).
  static bool selected_by(const RunConfig& config) {
    return config.resolved_distributed_type() == distributed_type && config.resolved_zero_stage() == Stage;
  }
  /// AcceleratorOptions::retain_freed_memory unset: freed buffers go back to the system. Kept,
  /// the units, buckets and gradients that come and go within a step stay resident: the
  /// memory sharding saves would be spent again on them.
  static constexpr bool retains_freed_memory = false;
};

namespace detail {

template <class B>
inline constexpr bool always_false = false;

/// Whether `config` selects Backend policy `B` (see BackendPolicy).
template <BackendPolicy B>
bool backend_selected_by(const RunConfig& config) {
  if constexpr (states_its_selection<B>) {
    return B::selected_by(config);
  } else {
    return config.resolved_distributed_type() == B::distributed_type &&
           (B::is_distributed || config.num_processes <= 1) && config.resolved_zero_stage() == 0;
  }
}

/// What AcceleratorOptions::retain_freed_memory means unset under Backend policy `B`: its
/// `retains_freed_memory` if it states one, else true.
template <class B>
inline constexpr bool retains_freed_memory_by_default = [] {
  if constexpr (requires { B::retains_freed_memory; }) return static_cast<bool>(B::retains_freed_memory);
  else return true;
}();

/// The engine behind a Backend policy (a distributed::BackendEngine). SingleProcess's is in
/// <accelerate/distributed/local_engine.hpp>; Gloo's and Nccl's in distributed/. The primary
/// template only explains which header is missing.
template <class B>
struct backend_engine {
  static_assert(always_false<B>,
                "accelerate: this Backend policy's engine is not included. For accelerate::Gloo "
                "include <accelerate/distributed/process_group.hpp> (or <accelerate/accelerate.hpp>); "
                "for accelerate::Zero<Gloo, N> <accelerate/distributed/sharded.hpp>; "
                "for accelerate::Nccl and Zero<Nccl, N> include <accelerate/distributed/nccl.hpp>.");
};

}  // namespace detail
}  // namespace accelerate
