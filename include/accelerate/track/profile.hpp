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
#include <torch/csrc/autograd/profiler_kineto.h>

#include <accelerate/detail/check.hpp>

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
  ProfileScope(const ProfileOptions& options, int rank, const c10::Device& device)
      : options_(options), rank_(rank) {
    namespace impl = torch::profiler::impl;
    ACCELERATE_CHECK(!impl::profilerEnabled(), "profile: LibTorch's profiler is already running in this "
                     "process (a profile() scope or torch::autograd::profiler call is still open); one "
                     "profiler runs at a time");
    std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
    if (options.cuda && device.is_cuda()) activities.insert(impl::ActivityType::CUDA);
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO, options.record_shapes, options.profile_memory,
                                      options.with_stack, options.with_flops);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    running_ = true;
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

  ~ProfileScope() {
    if (!running_) return;
    try {
      finish();
    } catch (const std::exception& e) {
      std::cerr << "accelerate: profile: " << e.what() << std::endl;
    }
  }

  /// Stops the profiler and writes the trace (staged, then renamed into place, so a reader
  /// never sees half of one); returns its path, empty without an output_trace_dir. Once.
  std::filesystem::path finish() {
    ACCELERATE_CHECK(running_, "profile: finish() was already called for this scope");
    running_ = false;
    result_ = torch::autograd::profiler::disableProfiler();
    if (options_.output_trace_dir.empty()) return {};
    std::error_code error;
    std::filesystem::create_directories(options_.output_trace_dir, error);
    ACCELERATE_CHECK(!error, "profile: cannot create the trace folder ", options_.output_trace_dir.string(),
                     ": ", error.message());
    const auto path = options_.output_trace_dir / ("profile_" + std::to_string(rank_) + ".json");
    const auto staged = std::filesystem::path(path.string() + ".partial");
    result_->save(staged.string());
    std::filesystem::rename(staged, path, error);
    ACCELERATE_CHECK(!error, "profile: cannot write ", path.string(), ": ", error.message());
    std::cerr << "accelerate: rank " << rank_ << " wrote its profile trace to " << path.string() << std::endl;
    return path;
  }

  /// The recorded events (operator name, thread, start and duration...), after finish().
  const std::vector<torch::autograd::profiler::KinetoEvent>& events() const {
    ACCELERATE_CHECK(result_ != nullptr, "profile: events() is available after finish()");
    return result_->events();
  }

 private:
  ProfileOptions options_;
  int rank_;
  bool running_ = false;
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result_;
};

}  // namespace accelerate
