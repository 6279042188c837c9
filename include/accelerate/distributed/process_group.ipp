// Bodies of process_group.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <cctype>
#include <sstream>

#include <accelerate/distributed/process_group.hpp>

namespace accelerate::distributed {

ACCELERATE_INLINE void ReducerHandle::before_forward() {
  if (reducer_) reducer_->recover_abandoned_backward();  // before the join sets up this round
  int root = 0;
  if (reducer_ && reducer_->join()) {
    const bool sync = reducer_->sync_enabled() && torch::autograd::GradMode::is_enabled();
    const auto notice = reducer_->join()->announce_forward(reducer_->join_index(), sync);
    reducer_->prepare_joined_round(notice.divisor, notice.sync);
    reducer_->expect_sync_as_announced(reducer_->sync_enabled());
    root = notice.buffer_root;
  }
  if (comm_ && !buffers_.empty()) broadcast_flat(*comm_, buffers_, root);
}

ACCELERATE_INLINE std::optional<checkpoint::Entry> ReducerHandle::checkpoint_entry(const std::string& name) const {
  if (!reducer_) return std::nullopt;
  const std::string key = "gradient_sync." + name;
  return checkpoint::Entry{checkpoint::Entry::Kind::gradient_sync, checkpoint::EntryOwner::every_rank,
                           [reducer = reducer_, key] {
                             StateDict state;
                             state.values[key] = reducer->layout_state();
                             for (auto& [name, tensor] : reducer->compression_state())
                               state.tensors[key + "." + name] = tensor;
                             return state;
                           },
                           [reducer = reducer_, key](const StateDict& state) {
                             if (!state.values.contains(key)) return;
                             const nlohmann::json& layout = state.values.at(key);
                             reducer->load_layout_state(layout);
                             std::map<std::string, at::Tensor> compression;
                             for (const auto& [name, tensor] : state.tensors)
                               if (name.rfind(key + ".", 0) == 0) compression[name.substr(key.size() + 1)] = tensor;
                             const int saved_world = layout.value("world_size", -1);  // -1: older checkpoint
                             reducer->load_compression_state(compression, saved_world);
                           }};
}

ACCELERATE_INLINE bool debug_mode_from_environment() {
  auto text = accelerate::detail::env_string("ACCELERATE_DEBUG_MODE");
  if (!text) return false;
  std::string value = *text;
  for (auto& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (value == "1" || value == "true" || value == "yes" || value == "y" || value == "on") return true;
  if (value == "0" || value == "false" || value == "no" || value == "n" || value == "off") return false;
  accelerate::detail::fail("environment variable ACCELERATE_DEBUG_MODE='", *text,
                           "' is not a boolean (1/true/yes or 0/false/no)");
}

ACCELERATE_INLINE compat::BackendPtr GlooFactory::create(compat::StorePtr store, const ProcessEnvironment& env,
                                                         const AcceleratorOptions& options) {
  const auto interface = accelerate::detail::env_string("GLOO_SOCKET_IFNAME").value_or("");
  const bool loopback = env.master_addr == "localhost" || env.master_addr.rfind("127.", 0) == 0;
  return compat::make_gloo_backend(std::move(store), env.rank, env.world_size, options.process_group.timeout,
                                   loopback ? "127.0.0.1" : "", interface);
}

ACCELERATE_INLINE ProcessGroupCore::ProcessGroupCore(const AcceleratorOptions& options, std::string_view fingerprint,
                                                     ProcessGroupTransport transport)
    : transport_(transport), env_(detect_environment()), timeout_(options.process_group.timeout),
      join_divide_by_initial_world_size_(options.ddp.join_divide_by_initial_world_size),
      collective_device_(transport.device(env_, options)) {
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
  auto backend = transport.create(compat::make_prefix_store("pg", store_), env_, options);
  comm_ = std::make_shared<Communicator>(std::move(backend), env_.rank, env_.world_size);
  if (verify) comm_->verify_collectives(collective_device_);
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

ACCELERATE_INLINE std::vector<at::Tensor> ProcessGroupCore::all_gather(const at::Tensor& tensor) {
  if (!comm_) return {tensor};
  return comm_->all_gather(tensor);
}

ACCELERATE_INLINE at::Tensor ProcessGroupCore::reduce_scatter(const at::Tensor& tensor, Reduction reduction) {
  if (!comm_) return tensor.clone();
  return comm_->reduce_scatter(tensor, reduction);
}

ACCELERATE_INLINE void ProcessGroupCore::check_same_on_every_rank(const std::string& key, const std::string& value,
                                                                  const std::string& subject) {
  if (!store_) return;
  const std::string prefix = next_check_key(key);
  wait_for_all(*store_, prefix, env_, value, timeout_, "prepare check");
  check_same_everywhere(*store_, prefix, env_, value, subject);
}

ACCELERATE_INLINE JoinScope ProcessGroupCore::join_uneven_inputs(const std::vector<ReducerHandle*>& models,
                                                                 std::function<void(int)> adopt) {
  if (!comm_) return {};
  std::vector<JoinContext::Member> members;
  for (const ReducerHandle* model : models) {
    ACCELERATE_CHECK(model->shared_reducer() != nullptr, "join_uneven_inputs: a model has no gradient reducer");
    ACCELERATE_CHECK(!model->shared_reducer()->join(), "join_uneven_inputs: a model is already inside a join "
                     "scope (scopes do not nest)");
    members.push_back({model->shared_reducer(), model->broadcast_buffers()});
  }
  auto context =
      std::make_shared<JoinContext>(comm_, std::move(members), collective_device_, join_divide_by_initial_world_size_);
  for (std::size_t m = 0; m < context->members().size(); ++m) context->members()[m].reducer->set_join(context, m);
  return JoinScope([context, adopt = std::move(adopt)] {
                     const int root = context->join();
                     if (adopt) adopt(root);
                   },
                   [context] {
                     for (const auto& member : context->members()) member.reducer->set_join(nullptr, 0);
                   });
}

ACCELERATE_INLINE ReducerHandle ProcessGroupCore::make_model_sync(
    torch::nn::Module& module, const std::string& name, const AcceleratorOptions& options, Sharding sharding,
    std::shared_ptr<ParameterUnits> units) {
  if (!comm_) return {};
  check_same_model(module, name);
  broadcast_state(module, options.ddp.broadcast_buffers);  // (a parameter cut as built is empty)
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (auto& item : module.named_parameters(true)) params.emplace_back(item.key(), item.value());
  auto reducer = std::make_shared<GradientReducer>(
      std::move(params), comm_, ReducerOptions{options.ddp, sharding, std::move(units)});
  reducer->install_hooks();
  std::vector<at::Tensor> buffers;
  if (options.ddp.broadcast_buffers)
    for (auto& b : module.buffers(true)) buffers.push_back(b);
  return ReducerHandle(std::move(reducer), std::move(buffers), comm_);
}

ACCELERATE_INLINE void ProcessGroupCore::check_same_model(torch::nn::Module& module, const std::string& name,
                                                          const std::string& caller) {
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

ACCELERATE_INLINE void ProcessGroupCore::broadcast_state(torch::nn::Module& module, bool with_buffers) {
  std::vector<at::Tensor> tensors = module.parameters(true);
  if (with_buffers)
    for (auto& b : module.buffers(true)) tensors.push_back(b);
  broadcast_flat(*comm_, tensors, 0);
}

}  // namespace accelerate::distributed
