// The engine behind the distributed Backend policies: rendezvous, a c10d process group, the
// collectives and one GradientReducer per prepared model. Gloo is defined here; Nccl reuses
// ProcessGroupEngine from <accelerate/distributed/nccl.hpp>.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
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
#include <accelerate/detail/linkage.hpp>
#include <accelerate/distributed/communicator.hpp>
#include <accelerate/distributed/engine.hpp>
#include <accelerate/distributed/heartbeat.hpp>
#include <accelerate/distributed/join.hpp>
#include <accelerate/distributed/process_environment.hpp>
#include <accelerate/distributed/reducer.hpp>
#include <accelerate/distributed/rendezvous.hpp>
#include <accelerate/distributed/stats.hpp>
#include <accelerate/options.hpp>
#include <accelerate/policy/backend.hpp>
#include <accelerate/scope/join.hpp>

namespace accelerate::distributed {

/// What a prepared model keeps for gradient synchronisation: its reducer (none when the job
/// has a single process) and, with broadcast_buffers, the buffers rank 0 broadcasts before
/// every forward (BatchNorm statistics stay the same on every rank, as in PyTorch DDP).
class ReducerHandle {
 public:
  ReducerHandle() = default;
  explicit ReducerHandle(std::shared_ptr<GradientReducer> reducer, std::vector<at::Tensor> buffers = {},
                         std::shared_ptr<Communicator> comm = {})
      : reducer_(std::move(reducer)), buffers_(std::move(buffers)), comm_(std::move(comm)) {}
  /// Before a forward pass: what a backward that threw left behind is cleared
  /// (GradientReducer::recover_abandoned_backward), then rank 0's buffers to every rank. Every rank must run the forward
  /// (as with DDP); DdpOptions::broadcast_buffers = false turns this off. Inside
  /// join_uneven_inputs the forward is first announced to the ranks that ran out (JoinContext),
  /// and the buffers come from the lowest rank still training.
  void before_forward();
  void set_sync(bool enabled) noexcept {
    if (reducer_) reducer_->set_sync(enabled);
  }
  bool sync_enabled() const noexcept { return !reducer_ || reducer_->sync_enabled(); }
  GradientReducer* reducer() const noexcept { return reducer_.get(); }
  /// The reducer, shared (a sharded engine keeps its models' reducers).
  const std::shared_ptr<GradientReducer>& shared_reducer() const noexcept { return reducer_; }
  /// Buffers broadcast before each forward (empty without broadcast_buffers).
  const std::vector<at::Tensor>& broadcast_buffers() const noexcept { return buffers_; }
  /// Whether expect_gradients_from is wanted (find_unused_parameters).
  bool wants_forward_outputs() const noexcept { return reducer_ && reducer_->finds_unused_parameters(); }
  /// The checkpoint entry of this model's gradient synchronisation (bucket order and rounds,
  /// GradientReducer::layout_state), kept in each rank's random_states file under
  /// "gradient_sync.<name>"; none without a reducer. A checkpoint without it (written before
  /// it existed) leaves the reducer as it is.
  std::optional<checkpoint::Entry> checkpoint_entry(const std::string& name) const;

  /// After a forward pass: its outputs, for finding the parameters backward will not reach.
  void expect_gradients_from(const std::vector<at::Tensor>& outputs) {
    if (reducer_) reducer_->expect_gradients_from(outputs);
  }

 private:
  std::shared_ptr<GradientReducer> reducer_;
  std::vector<at::Tensor> buffers_;
  std::shared_ptr<Communicator> comm_;
};

/// ACCELERATE_DEBUG_MODE as Accelerate reads it (1/true/yes or 0/false/no, any case); another
/// value is an error naming the variable.
bool debug_mode_from_environment();

/// Gloo: CPU tensors, any host. Binds loopback for a local job, GLOO_SOCKET_IFNAME when set,
/// else this host's name (as torch.distributed does).
struct GlooFactory {
  static c10::Device device(const ProcessEnvironment&, const AcceleratorOptions&) { return {c10::kCPU}; }
  static compat::BackendPtr create(compat::StorePtr store, const ProcessEnvironment& env,
                                   const AcceleratorOptions& options);
};

/// How a distributed engine reaches its transport: the device its collectives use and the
/// c10d backend it creates (GlooFactory, NcclFactory).
struct ProcessGroupTransport {
  c10::Device (*device)(const ProcessEnvironment&, const AcceleratorOptions&);
  compat::BackendPtr (*create)(compat::StorePtr, const ProcessEnvironment&, const AcceleratorOptions&);
};

/// Everything ProcessGroupEngine does, for any transport: one class, not a template, so a
/// trainer's translation unit does not generate its code again for the chosen transport (in
/// the separately compiled mode its bodies are compiled once, with the library's).
class ProcessGroupCore {
 public:
  static constexpr bool distributed = true;
  using ModelSync = ReducerHandle;

  /// Started without launcher variables it is a one-process job: rank 0 of 1, no group.
  /// Otherwise: rendezvous (every rank must pass the same `fingerprint`), then the
  /// transport's process group.
  ProcessGroupCore(const AcceleratorOptions& options, std::string_view fingerprint, ProcessGroupTransport transport);

  int rank() const noexcept { return env_.rank; }
  int world_size() const noexcept { return env_.world_size; }
  int local_rank() const noexcept { return env_.local_rank; }
  int local_world_size() const noexcept { return env_.local_world_size; }
  const ProcessEnvironment& environment() const noexcept { return env_; }
  c10::Device device(const AcceleratorOptions& options) const { return transport_.device(env_, options); }
  c10::Device collective_device() const noexcept { return collective_device_; }

  void barrier() {
    if (comm_) comm_->barrier();
  }
  void all_reduce(at::Tensor& tensor, Reduction reduction) {
    if (comm_) comm_->all_reduce(tensor, reduction);
  }
  void broadcast(at::Tensor& tensor, int root) {
    if (comm_) comm_->broadcast(tensor, root);
  }
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
  at::Tensor reduce_scatter(const at::Tensor& tensor, Reduction reduction);
  CommStats stats() const { return comm_ ? comm_->stats() : CommStats{}; }

  /// Every rank must pass the same `value` under `key` (what a prepared object looks like);
  /// a difference is an error on each rank naming both ranks and the first difference,
  /// before any collective could mismatch.
  void check_same_on_every_rank(const std::string& key, const std::string& value, const std::string& subject);

  /// The rendezvous store (null for a one-process job).
  c10d::Store* store() const noexcept { return store_.get(); }
  /// The communicator (null for a one-process job).
  Communicator* communicator() const noexcept { return comm_.get(); }

  /// Accelerator::join_uneven_inputs for these models: attaches a JoinContext to their
  /// reducers for the scope's life; once every rank has run out, `adopt(root)` runs on every
  /// rank with the rank the models were synchronised from. Empty for a one-process job.
  JoinScope join_uneven_inputs(const std::vector<ReducerHandle*>& models, std::function<void(int)> adopt = {});

  /// Checks the model is the same on every rank, broadcasts rank 0's parameters (and
  /// buffers), and builds its reducer.
  ReducerHandle make_model_sync(torch::nn::Module& module, const std::string& name,
                                const AcceleratorOptions& options) {
    return make_model_sync(module, name, options, Sharding::none);
  }

 protected:
  /// make_model_sync with the reducer's sharding and, for Sharding::parameters, the store of
  /// the model's parameters (sharded engines).
  ReducerHandle make_model_sync(torch::nn::Module& module, const std::string& name,
                                const AcceleratorOptions& options, Sharding sharding,
                                std::shared_ptr<ParameterUnits> units = {});

  /// Fails on every rank unless `module` has the same tensor names, dtypes and shapes on all;
  /// the error starts "<caller>: <name> must have".
  void check_same_model(torch::nn::Module& module, const std::string& name, const std::string& caller = "prepare");

 private:
  void broadcast_state(torch::nn::Module& module, bool with_buffers);

  // `key` made unique by the number of store checks before it, the same on every rank (each
  // makes the same checks in the same order). Names alone repeat: after free_memory() the
  // next model is model_0 again, and a rank could read the other's answer for the old one.
  std::string next_check_key(const std::string& key) { return key + "#" + std::to_string(store_checks_++); }

  ProcessGroupTransport transport_;
  ProcessEnvironment env_;
  std::size_t store_checks_ = 0;
  std::chrono::milliseconds timeout_;
  bool join_divide_by_initial_world_size_;  // DdpOptions::join_divide_by_initial_world_size
  c10::Device collective_device_;
  compat::StorePtr store_;
  std::shared_ptr<Heartbeat> heartbeat_;
  std::shared_ptr<Communicator> comm_;
};

/// The engine of a distributed Backend policy: ProcessGroupCore over the transport `Factory`
/// names (its static device() and create(), as GlooFactory's).
template <class Factory>
class ProcessGroupEngine : public ProcessGroupCore {
 public:
  ProcessGroupEngine(const AcceleratorOptions& options, std::string_view fingerprint)
      : ProcessGroupCore(options, fingerprint, ProcessGroupTransport{&Factory::device, &Factory::create}) {}
};

}  // namespace accelerate::distributed

namespace accelerate::detail {

template <>
struct backend_engine<Gloo> {
  using type = distributed::ProcessGroupEngine<distributed::GlooFactory>;
  static_assert(distributed::BackendEngine<type>);
};

}  // namespace accelerate::detail

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/distributed/process_group.ipp>
#endif
