// The engine behind the distributed Backend policies: rendezvous, a c10d process group, the
// collectives and one GradientReducer per prepared model. Gloo is defined here; Nccl reuses
// ProcessGroupEngine from <accelerate/distributed/nccl.hpp>.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>

#include <accelerate/checkpoint/module_state.hpp>
#include <accelerate/compat/c10d.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/env.hpp>
#include <accelerate/distributed/communicator.hpp>
#include <accelerate/distributed/environment.hpp>
#include <accelerate/distributed/heartbeat.hpp>
#include <accelerate/distributed/reducer.hpp>
#include <accelerate/distributed/rendezvous.hpp>
#include <accelerate/distributed/stats.hpp>
#include <accelerate/options.hpp>
#include <accelerate/policy/backend.hpp>

namespace accelerate::distributed {

/// What a prepared model keeps for gradient synchronisation: its reducer (none when the job
/// has a single process).
class ReducerHandle {
 public:
  ReducerHandle() = default;
  explicit ReducerHandle(std::shared_ptr<GradientReducer> reducer) : reducer_(std::move(reducer)) {}
  void set_sync(bool enabled) noexcept {
    if (reducer_) reducer_->set_sync(enabled);
  }
  bool sync_enabled() const noexcept { return !reducer_ || reducer_->sync_enabled(); }
  GradientReducer* reducer() const noexcept { return reducer_.get(); }

 private:
  std::shared_ptr<GradientReducer> reducer_;
};

/// Gloo: CPU tensors, any host. Binds loopback for a local job, GLOO_SOCKET_IFNAME when set,
/// else this host's name (as torch.distributed does).
struct GlooFactory {
  static c10::Device device(const ProcessEnvironment&, const AcceleratorOptions&) { return {c10::kCPU}; }
  static compat::BackendPtr create(compat::StorePtr store, const ProcessEnvironment& env,
                                   const AcceleratorOptions& options) {
    const auto interface = accelerate::detail::env_string("GLOO_SOCKET_IFNAME").value_or("");
    const bool loopback = env.master_addr == "localhost" || env.master_addr.rfind("127.", 0) == 0;
    return compat::make_gloo_backend(std::move(store), env.rank, env.world_size, options.timeout,
                                     loopback ? "127.0.0.1" : "", interface);
  }
};

/// The engine of a distributed Backend policy. `Factory` makes its c10d backend and picks the
/// device. Started without launcher variables it is a one-process job: rank 0 of 1, no group.
template <class Factory>
class ProcessGroupEngine {
 public:
  static constexpr bool distributed = true;
  using ModelSync = ReducerHandle;

  ProcessGroupEngine(const AcceleratorOptions& options, std::string_view fingerprint)
      : env_(detect_environment()), timeout_(options.timeout) {
    if (!env_.launched()) return;
    std::ostringstream description;
    description << fingerprint << " world_size=" << env_.world_size;
    // One store per process, kept for its lifetime: a later Accelerator in the same program
    // (ranks create them in the same order) rendezvous under its own key prefix instead of
    // racing a peer's not-yet-closed server on the same port.
    const auto [store, generation] = process_store(env_, timeout_);
    store_ = compat::make_prefix_store("accelerate/" + std::to_string(generation), store);
    rendezvous_in(*store_, env_, timeout_, description.str());
    auto backend = Factory::create(compat::make_prefix_store("pg", store_), env_, options);
    comm_ = std::make_shared<Communicator>(std::move(backend), env_.rank, env_.world_size);
    if (env_.world_size > 1) {
      heartbeat_ = std::make_shared<Heartbeat>(env_, "accelerate/" + std::to_string(generation));
      comm_->set_diagnosis([heartbeat = std::weak_ptr<Heartbeat>(heartbeat_)] {
        const auto alive = heartbeat.lock();
        return alive ? alive->diagnose() : std::string("a peer exited or timed out");
      });
    }
    // Nobody leaves start-up (and may exit, taking rank 0's store with it) before all are in.
    wait_for_all(*store_, "ready", env_, "1", timeout_, "process group");
  }

  int rank() const noexcept { return env_.rank; }
  int world_size() const noexcept { return env_.world_size; }
  int local_rank() const noexcept { return env_.local_rank; }
  int local_world_size() const noexcept { return env_.local_world_size; }
  const ProcessEnvironment& environment() const noexcept { return env_; }
  c10::Device device(const AcceleratorOptions& options) const { return Factory::device(env_, options); }

  void barrier() {
    if (comm_) comm_->barrier();
  }
  void all_reduce(at::Tensor& tensor, Reduction reduction) {
    if (comm_) comm_->all_reduce(tensor, reduction);
  }
  void broadcast(at::Tensor& tensor, int root) {
    if (comm_) comm_->broadcast(tensor, root);
  }
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor) {
    if (!comm_) return {tensor};
    return comm_->all_gather(tensor);
  }
  CommStats stats() const { return comm_ ? comm_->stats() : CommStats{}; }

  /// The rendezvous store (null for a one-process job).
  c10d::Store* store() const noexcept { return store_.get(); }
  /// The communicator (null for a one-process job).
  Communicator* communicator() const noexcept { return comm_.get(); }

  /// Checks the model is the same on every rank, broadcasts rank 0's parameters (and
  /// buffers), and builds its reducer.
  ReducerHandle make_model_sync(torch::nn::Module& module, const std::string& name,
                                const AcceleratorOptions& options) {
    if (!comm_) return {};
    check_same_model(module, name);
    broadcast_state(module, options.broadcast_buffers);
    std::vector<std::pair<std::string, at::Tensor>> params;
    for (auto& item : module.named_parameters(true)) params.emplace_back(item.key(), item.value());
    auto reducer = std::make_shared<GradientReducer>(
        std::move(params), comm_,
        ReducerOptions{options.bucket_cap_bytes, options.first_bucket_cap_bytes,
                       options.find_unused_parameters});
    reducer->install_hooks();
    return ReducerHandle(std::move(reducer));
  }

 private:
  void check_same_model(torch::nn::Module& module, const std::string& name) {
    std::ostringstream shapes;
    for (const auto& [key, tensor] : checkpoint::named_tensors(module)) {
      shapes << key << ":" << tensor.scalar_type() << "[";
      for (int64_t d = 0; d < tensor.dim(); ++d) shapes << (d ? "," : "") << tensor.size(d);
      shapes << "] ";  // one field per tensor: no spaces inside
    }
    const std::string mine = shapes.str();
    const std::string prefix = "model/" + name;
    wait_for_all(*store_, prefix, env_, mine, timeout_, "model check");
    check_same_everywhere(*store_, prefix, env_, mine,
                          "prepare: " + name + " must have the same parameter names, dtypes and "
                          "shapes on every rank");
  }

  void broadcast_state(torch::nn::Module& module, bool with_buffers) {
    torch::NoGradGuard no_grad;
    std::map<int, std::vector<at::Tensor>> by_dtype;  // one flat broadcast per dtype
    for (auto& p : module.parameters(true)) by_dtype[static_cast<int>(p.scalar_type())].push_back(p);
    if (with_buffers)
      for (auto& b : module.buffers(true)) by_dtype[static_cast<int>(b.scalar_type())].push_back(b);
    for (auto& [dtype, tensors] : by_dtype) {
      std::vector<at::Tensor> flat_parts;
      for (auto& t : tensors) flat_parts.push_back(t.detach().reshape(-1));
      at::Tensor flat = at::cat(flat_parts);
      comm_->broadcast(flat, 0);
      int64_t offset = 0;
      for (auto& t : tensors) {
        t.detach().copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
    }
  }

  ProcessEnvironment env_;
  std::chrono::milliseconds timeout_;
  compat::StorePtr store_;
  std::shared_ptr<Heartbeat> heartbeat_;
  std::shared_ptr<Communicator> comm_;
};

}  // namespace accelerate::distributed

namespace accelerate::detail {

template <>
struct backend_engine<Gloo> {
  using type = distributed::ProcessGroupEngine<distributed::GlooFactory>;
};

}  // namespace accelerate::detail
