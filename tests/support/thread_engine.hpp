// A fake BackendEngine for tests: the ranks of a job are threads of one process, and each
// collective is an exchange through shared slots. It lets collectives and the Accelerator be
// tested at world size 3 in-process, in milliseconds, and shows what a new engine provides.
// (Multi-process tests still use real processes, TCPStore and Gloo.)
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include <accelerate/detail/check.hpp>
#include <accelerate/distributed/engine.hpp>
#include <accelerate/distributed/local_engine.hpp>
#include <accelerate/policy/backend.hpp>

namespace accelerate::testing {

/// What the threads of one fake job share: a slot per rank and a barrier that gives up after
/// a timeout (a rank that threw early must fail the test, not hang it).
class ThreadGroup {
 public:
  explicit ThreadGroup(int world_size, std::chrono::milliseconds timeout = std::chrono::seconds(30))
      : world_size_(world_size), timeout_(timeout), tensors_(world_size), texts_(world_size) {}

  int world_size() const noexcept { return world_size_; }

  /// Every rank's `mine` (copied), in rank order.
  std::vector<at::Tensor> exchange(int rank, const at::Tensor& mine) {
    tensors_[static_cast<std::size_t>(rank)] = mine.detach().clone();
    arrive_and_wait();
    std::vector<at::Tensor> all;
    for (const auto& t : tensors_) all.push_back(t.clone());
    arrive_and_wait();  // nobody overwrites a slot before all have read it
    return all;
  }
  std::vector<std::string> exchange(int rank, const std::string& mine) {
    texts_[static_cast<std::size_t>(rank)] = mine;
    arrive_and_wait();
    std::vector<std::string> all = texts_;
    arrive_and_wait();
    return all;
  }

 private:
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const std::uint64_t generation = generation_;
    if (++arrived_ == world_size_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
      return;
    }
    ACCELERATE_CHECK(changed_.wait_for(lock, timeout_, [&] { return generation_ != generation; }),
                     "ThreadGroup: a rank did not reach the collective within ", timeout_.count(), " ms");
  }

  int world_size_;
  std::chrono::milliseconds timeout_;
  std::vector<at::Tensor> tensors_;
  std::vector<std::string> texts_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
};

/// One rank of a ThreadGroup, modelling accelerate::distributed::BackendEngine. Built like
/// every engine, from the options and the fingerprint; the group and rank come from the
/// calling thread (ThreadEngine::Binding), so Accelerator<ThreadBackend> works unchanged.
class ThreadEngine {
 public:
  static constexpr bool distributed = true;
  using ModelSync = distributed::NoModelSync;

  /// Binds the calling thread to rank `rank` of `group` while it lives.
  struct Binding {
    Binding(ThreadGroup& group, int rank) {
      bound_group() = &group;
      bound_rank() = rank;
    }
    ~Binding() { bound_group() = nullptr; }
    Binding(const Binding&) = delete;
    Binding& operator=(const Binding&) = delete;
  };

  ThreadEngine(const AcceleratorOptions&, std::string_view) : group_(bound_group()), rank_(bound_rank()) {
    ACCELERATE_CHECK(group_ != nullptr, "ThreadEngine: build it on a thread holding a ThreadEngine::Binding");
  }

  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return group_->world_size(); }
  int local_rank() const noexcept { return rank_; }
  int local_world_size() const noexcept { return group_->world_size(); }
  c10::Device device(const AcceleratorOptions&) const { return {c10::kCPU}; }
  c10::Device collective_device() const { return {c10::kCPU}; }

  void barrier() {
    group_->exchange(rank_, std::string());
    stats_.barrier.add(0);
  }

  void all_reduce(at::Tensor& tensor, Reduction reduction) {
    tensor.copy_(reduced(tensor, reduction, "all_reduce"));
    stats_.allreduce.add(bytes(tensor));
  }

  void broadcast(at::Tensor& tensor, int root) {
    const auto all = checked_exchange(tensor, "broadcast");
    tensor.copy_(all[static_cast<std::size_t>(root)]);
    stats_.broadcast.add(bytes(tensor));
  }

  std::vector<at::Tensor> all_gather(const at::Tensor& tensor) {
    auto all = checked_exchange(tensor, "all_gather");
    stats_.allgather.add(bytes(tensor));
    return all;
  }

  at::Tensor reduce_scatter(const at::Tensor& tensor, Reduction reduction) {
    ACCELERATE_CHECK(tensor.dim() > 0 && tensor.size(0) % world_size() == 0,
                     "ThreadEngine::reduce_scatter: dimension 0 does not split into ", world_size(), " slices");
    const at::Tensor all = reduced(tensor, reduction, "reduce_scatter");
    stats_.reduce_scatter.add(bytes(tensor));
    return all.chunk(world_size())[static_cast<std::size_t>(rank_)].clone();
  }

  CommStats stats() const { return stats_; }

  void check_same_on_every_rank(const std::string& key, const std::string& value, const std::string& subject) {
    const auto all = group_->exchange(rank_, key + "\n" + value);
    for (int r = 0; r < world_size(); ++r)
      ACCELERATE_CHECK(all[static_cast<std::size_t>(r)] == key + "\n" + value, subject, ": rank ", rank_,
                       " and rank ", r, " differ");
  }

  ModelSync make_model_sync(torch::nn::Module&, const std::string&, const AcceleratorOptions&) { return {}; }

 private:
  // A transport fails on mismatched sizes; so does this fake, on every rank alike.
  std::vector<at::Tensor> checked_exchange(const at::Tensor& tensor, const char* what) {
    auto all = group_->exchange(rank_, tensor);
    for (const auto& t : all)
      ACCELERATE_CHECK(t.sizes() == all[0].sizes() && t.scalar_type() == all[0].scalar_type(), "ThreadEngine: ",
                       what, " of tensors whose sizes or dtypes differ between ranks");
    return all;
  }
  at::Tensor reduced(const at::Tensor& tensor, Reduction reduction, const char* what) {
    const auto all = checked_exchange(tensor, what);
    at::Tensor result = all[0].clone();
    for (std::size_t r = 1; r < all.size(); ++r) {
      if (reduction == Reduction::max) result = at::maximum(result, all[r]);
      else if (reduction == Reduction::min) result = at::minimum(result, all[r]);
      else result.add_(all[r]);
    }
    if (reduction == Reduction::mean) {
      if (result.is_floating_point()) result.div_(world_size());
      else result.floor_divide_(world_size());
    }
    return result;
  }
  static std::uint64_t bytes(const at::Tensor& t) {
    return static_cast<std::uint64_t>(t.numel()) * t.element_size();
  }
  static ThreadGroup*& bound_group() {
    thread_local ThreadGroup* group = nullptr;
    return group;
  }
  static int& bound_rank() {
    thread_local int rank = 0;
    return rank;
  }

  ThreadGroup* group_;
  int rank_;
  CommStats stats_;
};

static_assert(distributed::BackendEngine<ThreadEngine>);

/// Runs `body(rank)` on `world_size` threads and returns each rank's error ("" when none).
inline std::vector<std::string> run_threads(int world_size, const std::function<void(ThreadGroup&, int)>& body,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  ThreadGroup group(world_size, timeout);
  std::vector<std::string> errors(static_cast<std::size_t>(world_size));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(group, r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

/// A Backend policy whose engine is ThreadEngine: Accelerator<ThreadBackend> on threads.
struct ThreadBackend {
  static constexpr std::string_view name = "ThreadBackend";
  static constexpr std::string_view distributed_type = "MULTI_CPU";
  static constexpr bool is_distributed = true;
  static constexpr bool requires_cuda = false;
};

}  // namespace accelerate::testing

template <>
struct accelerate::detail::backend_engine<accelerate::testing::ThreadBackend> {
  using type = accelerate::testing::ThreadEngine;
};
