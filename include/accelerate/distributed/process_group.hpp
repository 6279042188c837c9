// The engine behind the distributed Backend policies: rendezvous, a c10d process group, the
// collectives and one GradientReducer per prepared model. Gloo is defined here; Nccl reuses
// ProcessGroupEngine from <accelerate/distributed/nccl.hpp>.
#pragma once

#include <cctype>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
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
  /// Before a forward pass: rank 0's buffers to every rank. Every rank must run the forward
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

/// The engine of a distributed Backend policy. `Factory` makes its c10d backend and picks the
/// device. Started without launcher variables it is a one-process job: rank 0 of 1, no group.
template <class Factory>
class ProcessGroupEngine {
 public:
  static constexpr bool distributed = true;
  using ModelSync = ReducerHandle;

  ProcessGroupEngine(const AcceleratorOptions& options, std::string_view fingerprint)
      : env_(detect_environment()), timeout_(options.process_group.timeout), collective_device_(Factory::device(env_, options)) {
    if (!env_.launched()) return;
    const bool verify = options.process_group.verify_collectives || debug_mode_from_environment();
    std::ostringstream description;
    // verify_collectives is compared here but not in the checkpoint's fingerprint: a debugging
    // run may resume a normal one; a rank verifying among ranks that do not would pair its
    // descriptions with their payloads.
    description << fingerprint << " world_size=" << env_.world_size << " process_group.verify_collectives=" << verify;
    // Stage 3's prefetch changes the order of its collectives, not what a checkpoint holds.
    if (!options.ddp.prefetch_units) description << " ddp.prefetch_units=0";
    // Ranks that disagree would pair an all-to-all with an all-reduce.
    if (!options.process_group.reduce_scatter_all_to_all) description << " process_group.reduce_scatter_all_to_all=0";
    // One store per process, kept for its lifetime: a later Accelerator in the same program
    // (ranks create them in the same order) rendezvous under its own key prefix instead of
    // racing a peer's not-yet-closed server on the same port.
    const auto [store, generation] = process_store(env_, timeout_);
    store_ = compat::make_prefix_store("accelerate/" + std::to_string(generation), store);
    rendezvous_in(*store_, env_, timeout_, description.str());
    auto backend = Factory::create(compat::make_prefix_store("pg", store_), env_, options);
    comm_ = std::make_shared<Communicator>(std::move(backend), env_.rank, env_.world_size);
    if (verify) comm_->verify_collectives(Factory::device(env_, options));
    comm_->use_all_to_all_reduce_scatter(options.process_group.reduce_scatter_all_to_all);
    if (env_.world_size > 1) {
      heartbeat_ = std::make_shared<Heartbeat>(env_, "accelerate/" + std::to_string(generation));
      comm_->set_diagnosis([heartbeat = std::weak_ptr<Heartbeat>(heartbeat_)] {
        const auto alive = heartbeat.lock();
        return alive ? alive->diagnose() : std::string("a peer exited or timed out");
      });
    }
    // Nobody leaves start-up (and may exit, taking rank 0's store with it) before all are in.
    wait_for_all(*store_, "ready", env_, "1", timeout_, "process group");
    check_claims(*store_, env_);  // a duplicate RANK that came after the others joined
  }

  int rank() const noexcept { return env_.rank; }
  int world_size() const noexcept { return env_.world_size; }
  int local_rank() const noexcept { return env_.local_rank; }
  int local_world_size() const noexcept { return env_.local_world_size; }
  const ProcessEnvironment& environment() const noexcept { return env_; }
  c10::Device device(const AcceleratorOptions& options) const { return Factory::device(env_, options); }
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
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor) {
    if (!comm_) return {tensor};
    return comm_->all_gather(tensor);
  }
  at::Tensor reduce_scatter(const at::Tensor& tensor, Reduction reduction) {
    if (!comm_) return tensor.clone();
    return comm_->reduce_scatter(tensor, reduction);
  }
  CommStats stats() const { return comm_ ? comm_->stats() : CommStats{}; }

  /// Every rank must pass the same `value` under `key` (what a prepared object looks like);
  /// a difference is an error on each rank naming both ranks and the first difference,
  /// before any collective could mismatch.
  void check_same_on_every_rank(const std::string& key, const std::string& value, const std::string& subject) {
    if (!store_) return;
    const std::string prefix = next_check_key(key);
    wait_for_all(*store_, prefix, env_, value, timeout_, "prepare check");
    check_same_everywhere(*store_, prefix, env_, value, subject);
  }

  /// The rendezvous store (null for a one-process job).
  c10d::Store* store() const noexcept { return store_.get(); }
  /// The communicator (null for a one-process job).
  Communicator* communicator() const noexcept { return comm_.get(); }

  /// Accelerator::join_uneven_inputs for these models: attaches a JoinContext to their
  /// reducers for the scope's life; once every rank has run out, `adopt(root)` runs on every
  /// rank with the rank the models were synchronised from. Empty for a one-process job.
  JoinScope join_uneven_inputs(const std::vector<ReducerHandle*>& models, std::function<void(int)> adopt = {}) {
    if (!comm_) return {};
    std::vector<JoinContext::Member> members;
    for (const ReducerHandle* model : models) {
      ACCELERATE_CHECK(model->shared_reducer() != nullptr, "join_uneven_inputs: a model has no gradient reducer");
      ACCELERATE_CHECK(!model->shared_reducer()->join(), "join_uneven_inputs: a model is already inside a join "
                       "scope (scopes do not nest)");
      members.push_back({model->shared_reducer(), model->broadcast_buffers()});
    }
    auto context = std::make_shared<JoinContext>(comm_, std::move(members), collective_device_);
    for (std::size_t m = 0; m < context->members().size(); ++m) context->members()[m].reducer->set_join(context, m);
    return JoinScope([context, adopt = std::move(adopt)] {
                       const int root = context->join();
                       if (adopt) adopt(root);
                     },
                     [context] {
                       for (const auto& member : context->members()) member.reducer->set_join(nullptr, 0);
                     });
  }

  /// Checks the model is the same on every rank, broadcasts rank 0's parameters (and
  /// buffers), and builds its reducer.
  ReducerHandle make_model_sync(torch::nn::Module& module, const std::string& name,
                                const AcceleratorOptions& options) {
    return make_model_sync(module, name, options, Sharding::none);
  }

 protected:
  /// make_model_sync with the reducer's sharding and, for Sharding::parameters, its units
  /// (sharded engines).
  ReducerHandle make_model_sync(torch::nn::Module& module, const std::string& name,
                                const AcceleratorOptions& options, Sharding sharding,
                                std::vector<std::string> units = {},
                                std::unordered_map<const c10::TensorImpl*, BuiltSlice> built = {}) {
    if (!comm_) return {};
    check_same_model(module, name);
    broadcast_state(module, options.ddp.broadcast_buffers);  // (a parameter cut as built is empty)
    std::vector<std::pair<std::string, at::Tensor>> params;
    for (auto& item : module.named_parameters(true)) params.emplace_back(item.key(), item.value());
    ReducerOptions reducer_options = ReducerOptions::from(options.ddp, sharding);
    reducer_options.units = std::move(units);
    reducer_options.built = std::move(built);
    auto reducer = std::make_shared<GradientReducer>(std::move(params), comm_, std::move(reducer_options));
    reducer->install_hooks();
    std::vector<at::Tensor> buffers;
    if (options.ddp.broadcast_buffers)
      for (auto& b : module.buffers(true)) buffers.push_back(b);
    return ReducerHandle(std::move(reducer), std::move(buffers), comm_);
  }

  /// Fails on every rank unless `module` has the same tensor names, dtypes and shapes on all;
  /// the error starts "<caller>: <name> must have".
  void check_same_model(torch::nn::Module& module, const std::string& name, const std::string& caller = "prepare") {
    std::ostringstream shapes;
    for (const auto& [key, tensor] : checkpoint::named_tensors(module)) {
      shapes << key << ":" << tensor.scalar_type() << "[";
      for (int64_t d = 0; d < tensor.dim(); ++d) shapes << (d ? "," : "") << tensor.size(d);
      shapes << "] ";  // one field per tensor: no spaces inside
    }
    const std::string mine = shapes.str();
    const std::string prefix = next_check_key("model/" + name);
    wait_for_all(*store_, prefix, env_, mine, timeout_, "model check");
    check_same_everywhere(*store_, prefix, env_, mine,
                          caller + ": " + name + " must have the same parameter names, dtypes and "
                          "shapes on every rank");
  }

 private:
  void broadcast_state(torch::nn::Module& module, bool with_buffers) {
    std::vector<at::Tensor> tensors = module.parameters(true);
    if (with_buffers)
      for (auto& b : module.buffers(true)) tensors.push_back(b);
    broadcast_flat(*comm_, tensors, 0);
  }

  // `key` made unique by the number of store checks before it, the same on every rank (each
  // makes the same checks in the same order). Names alone repeat: after free_memory() the
  // next model is model_0 again, and a rank could read the other's answer for the old one.
  std::string next_check_key(const std::string& key) { return key + "#" + std::to_string(store_checks_++); }

  ProcessEnvironment env_;
  std::size_t store_checks_ = 0;
  std::chrono::milliseconds timeout_;
  c10::Device collective_device_;
  compat::StorePtr store_;
  std::shared_ptr<Heartbeat> heartbeat_;
  std::shared_ptr<Communicator> comm_;
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
