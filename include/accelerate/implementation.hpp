// The bodies of the library's type-independent functions, for programs compiled with
// ACCELERATE_SEPARATE_COMPILATION: include this header in exactly one source file of the
// program (and nowhere else); every translation unit, that one included, is compiled with the
// macro defined. Without the macro the headers include these bodies themselves and this header
// is not needed. <accelerate/config.hpp>, <accelerate/data/idx.hpp> and
// <accelerate/distributed/nccl.hpp>, which need optional dependencies, stay header-only in
// both modes.
//
// Example (CMake: target_link_libraries(trainer PRIVATE accelerate::separate_compilation)):
//   // accelerate_implementation.cpp, one per program
//   #include <accelerate/implementation.hpp>
#pragma once

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#error "accelerate/implementation.hpp: define ACCELERATE_SEPARATE_COMPILATION in every translation unit (link accelerate::separate_compilation); header-only programs do not include this header"
#endif

#include <accelerate/accelerate.hpp>
#include <accelerate/distributed/sharded.hpp>

#include <accelerate/accelerator.ipp>
#include <accelerate/amp/grad_scaler.ipp>
#include <accelerate/checkpoint/atomic_dir.ipp>
#include <accelerate/checkpoint/files.ipp>
#include <accelerate/checkpoint/module_state.ipp>
#include <accelerate/checkpoint/optimizer_state.ipp>
#include <accelerate/checkpoint/project.ipp>
#include <accelerate/checkpoint/registry.ipp>
#include <accelerate/checkpoint/safetensors.ipp>
#include <accelerate/checkpoint/shard_manifest.ipp>
#include <accelerate/checkpoint/sharding.ipp>
#include <accelerate/checkpoint/state.ipp>
#include <accelerate/checkpoint/stateful.ipp>
#include <accelerate/compat/c10d.ipp>
#include <accelerate/compat/torch.ipp>
#include <accelerate/data/batch_layout.ipp>
#include <accelerate/data/prefetcher.ipp>
#include <accelerate/data/shard_sampler.ipp>
#include <accelerate/data/staging.ipp>
#include <accelerate/data/tensor_dataset.ipp>
#include <accelerate/detail/check.ipp>
#include <accelerate/detail/env.ipp>
#include <accelerate/detail/malloc_tuning.ipp>
#include <accelerate/distributed/bucket_layout.ipp>
#include <accelerate/distributed/bucket_reduction.ipp>
#include <accelerate/distributed/communicator.ipp>
#include <accelerate/distributed/compression.ipp>
#include <accelerate/distributed/heartbeat.ipp>
#include <accelerate/distributed/join.ipp>
#include <accelerate/distributed/layout_check.ipp>
#include <accelerate/distributed/parameter_units.ipp>
#include <accelerate/distributed/process_environment.ipp>
#include <accelerate/distributed/process_group.ipp>
#include <accelerate/distributed/reducer.ipp>
#include <accelerate/distributed/rendezvous.ipp>
#include <accelerate/distributed/sharded.ipp>
#include <accelerate/distributed/units.ipp>
#include <accelerate/environment_report.ipp>
#include <accelerate/launch/cli.ipp>
#include <accelerate/launch/supervisor.ipp>
#include <accelerate/memory/activation_checkpoint.ipp>
#include <accelerate/options.ipp>
#include <accelerate/optim/fused_adam.ipp>
#include <accelerate/optim/warmup_cosine.ipp>
#include <accelerate/policy/slots.ipp>
#include <accelerate/prepared/dataloader.ipp>
#include <accelerate/prepared/scheduler.ipp>
#include <accelerate/run_config.ipp>
#include <accelerate/scope/join.ipp>
#include <accelerate/step/accumulation.ipp>
#include <accelerate/step/context.ipp>
#include <accelerate/step/item_weighting.ipp>
#include <accelerate/track/csv.ipp>
#include <accelerate/track/fingerprint.ipp>
#include <accelerate/track/jsonl.ipp>
#include <accelerate/track/profile.ipp>
#include <accelerate/track/progress.ipp>
#include <accelerate/track/tensorboard.ipp>
#include <accelerate/track/trackers.ipp>
