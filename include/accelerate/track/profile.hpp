// ProfileScope: LibTorch's profiler (Kineto, as the PyTorch wheel ships it) around a block of a
// training loop, writing one Chrome trace per rank — what acc.profile() returns.
#pragma once

#include <filesystem>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include <c10/core/Device.h>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

// Declared only: the profiler's header is included by profile.ipp, which uses it, so that a
// trainer compiled with ACCELERATE_SEPARATE_COMPILATION does not parse it (bench/README.md,
// "Compile cost of a trainer").
namespace torch::autograd::profiler {
struct KinetoEvent;
struct ProfilerResult;
}  // namespace torch::autograd::profiler

namespace accelerate {

/// What acc.profile() records and where it writes (Accelerate's ProfileKwargs).
/// Example:
///   auto scope = acc.profile({.output_trace_dir = "traces", .record_shapes = true});
struct ProfileOptions {
  /// Each rank writes `profile_<rank>.json` here (Accelerate's name), created if missing; the
  /// path is printed to stderr. Empty: nothing is written, the events stay in the scope.
  std::filesystem::path output_trace_dir;
  /// Record the input shapes of every operator.
  bool record_shapes = false;
  /// Record tensor allocations and frees.
  bool profile_memory = false;
  /// Record the C++ call stack of every operator.
  bool with_stack = false;
  /// Estimate the FLOPs of matrix products and convolutions.
  bool with_flops = false;
  /// Record CUDA kernels too (only where the accelerator's device is a GPU).
  bool cuda = true;
};

/// While it lives, LibTorch's profiler records this process's operators — forward, backward,
/// optimizer, and the process group's collectives (`gloo:all_reduce`, `nccl:all_reduce`) —
/// and CUDA kernels on a GPU. finish() (or the destructor, also when an exception leaves the
/// block) stops it and writes the Chrome trace (chrome://tracing, Perfetto, TensorBoard's
/// profiler plugin read it). One profiler runs per process at a time.
/// Example:
///   {
///     auto profiling = acc.profile({.output_trace_dir = "traces"});
///     for (int i = 0; i < 5; ++i) train_step();
///   }  // traces/profile_<rank>.json
class ProfileScope {
 public:
  ProfileScope(const ProfileOptions& options, int rank, const c10::Device& device);
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

  ~ProfileScope();

  /// Stops the profiler and writes the trace (staged, then renamed into place, so a reader
  /// never sees half of one); returns its path, empty without an output_trace_dir. Once.
  std::filesystem::path finish();

  /// The recorded events (operator name, thread, start and duration...), after finish().
  /// Reading them takes <torch/csrc/autograd/profiler_kineto.h>, which this header includes
  /// only when header-only.
  const std::vector<torch::autograd::profiler::KinetoEvent>& events() const;

 private:
  ProfileOptions options_;
  int rank_;
  bool running_ = false;
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result_;
};

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/track/profile.ipp>
#endif
