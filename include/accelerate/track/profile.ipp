// Bodies of profile.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <torch/csrc/autograd/profiler_kineto.h>

#include <accelerate/track/profile.hpp>

namespace accelerate {

ACCELERATE_INLINE ProfileScope::ProfileScope(const ProfileOptions& options, int rank, const c10::Device& device)
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

ACCELERATE_INLINE ProfileScope::~ProfileScope() {
  if (!running_) return;
  try {
    finish();
  } catch (const std::exception& e) {
    std::cerr << "accelerate: profile: " << e.what() << std::endl;
  }
}

ACCELERATE_INLINE std::filesystem::path ProfileScope::finish() {
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

ACCELERATE_INLINE const std::vector<torch::autograd::profiler::KinetoEvent>& ProfileScope::events() const {
  ACCELERATE_CHECK(result_ != nullptr, "profile: events() is available after finish()");
  return result_->events();
}

}  // namespace accelerate
