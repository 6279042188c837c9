// Communicator: this process's c10d backend and the collectives the accelerator needs,
// counted in CommStats. Errors say which collective failed on which rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include <accelerate/compat/c10d.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/distributed/reduction.hpp>
#include <accelerate/distributed/stats.hpp>

namespace accelerate::distributed {

/// Collectives over one c10d backend. Thread-safe counting: gradient hooks may run on
/// autograd's device threads.
/// Example:
///   comm.all_reduce(t, accelerate::Reduction::sum);
class Communicator {
 public:
  Communicator(compat::BackendPtr backend, int rank, int world_size)
      : backend_(std::move(backend)), rank_(rank), world_size_(world_size) {}

  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }
  c10d::Backend& backend() noexcept { return *backend_; }

  /// In-place all-reduce. Gloo has no AVG, so mean is a sum divided by the world size.
  void all_reduce(at::Tensor& tensor, Reduction reduction) {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = reduction == Reduction::max   ? c10d::ReduceOp::MAX
                       : reduction == Reduction::min ? c10d::ReduceOp::MIN
                                                     : c10d::ReduceOp::SUM;
    wait(backend_->allreduce(tensors, options), "all_reduce");
    count(stats_.allreduce, tensor);
    if (reduction == Reduction::mean) {
      if (tensor.is_floating_point()) tensor.div_(world_size_);
      else tensor.floor_divide_(world_size_);
    }
  }

  /// Starts a sum all-reduce of `tensor` and returns its work handle (for gradient buckets).
  compat::WorkPtr all_reduce_async(at::Tensor& tensor) {
    std::vector<at::Tensor> tensors{tensor};
    auto work = backend_->allreduce(tensors);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.allreduce.add(bytes(tensor));
    stats_.gradient_allreduce.add(bytes(tensor));
    return work;
  }

  /// In-place broadcast from `root`.
  void broadcast(at::Tensor& tensor, int root) {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    wait(backend_->broadcast(tensors, options), "broadcast");
    count(stats_.broadcast, tensor);
  }

  /// Every rank's copy of `tensor` (same shape everywhere), in rank order.
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor) {
    at::Tensor input = tensor.contiguous();
    std::vector<at::Tensor> inputs{input};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < world_size_; ++r) outputs[0].push_back(at::empty_like(input));
    wait(backend_->allgather(outputs, inputs), "all_gather");
    count(stats_.allgather, input);
    return outputs[0];
  }

  void barrier() {
    wait(backend_->barrier(), "barrier");
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.barrier.add(0);
  }

  /// Waits for a collective; a failure (peer gone, timeout) becomes an accelerate::Error
  /// naming the collective, this rank and, from the heartbeat, which rank stopped.
  void wait(const compat::WorkPtr& work, const char* what) {
    try {
      work->wait();
    } catch (const std::exception& e) {
      const std::string cause = diagnose_ ? diagnose_() : "a peer exited or timed out";
      accelerate::detail::fail(what, " failed on rank ", rank_, " of ", world_size_, ": ", cause,
                               " (", e.what(), ")");
    }
  }

  /// How to explain a failed collective (the engine's heartbeat).
  void set_diagnosis(std::function<std::string()> diagnose) { diagnose_ = std::move(diagnose); }

  CommStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  /// Counts one completed gradient synchronisation round.
  void count_grad_sync_round() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.grad_sync_rounds;
  }

 private:
  static std::uint64_t bytes(const at::Tensor& t) {
    return static_cast<std::uint64_t>(t.numel()) * t.element_size();
  }
  void count(CollectiveCount& counter, const at::Tensor& t) {
    std::lock_guard<std::mutex> lock(mutex_);
    counter.add(bytes(t));
  }

  compat::BackendPtr backend_;
  int rank_;
  int world_size_;
  mutable std::mutex mutex_;
  CommStats stats_;
  std::function<std::string()> diagnose_;
};

}  // namespace accelerate::distributed
