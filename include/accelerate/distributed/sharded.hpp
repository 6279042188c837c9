// The engine of the sharded Backend policies Zero<Transport, 1|2|3>: the process group,
// rendezvous and collectives of ProcessGroupEngine, with sharded gradient reducers and the
// engine hooks (distributed/engine.hpp) where sharding differs from data parallel: the
// optimizer is narrowed to this rank's shard when prepared, its step all-gathers the updated
// parameters (stage 3: the next forward does), clipping reduces the norm's parts across ranks,
// fp16 ranks agree on skipping, and each rank checkpoints its own optimizer shard (stage 3:
// and parameter shard) with a manifest of what it holds.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(__GLIBC__) || __has_include(<malloc.h>)
#include <malloc.h>  // malloc_trim
#endif

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include <accelerate/checkpoint/module_state.hpp>
#include <accelerate/checkpoint/optimizer_state.hpp>
#include <accelerate/checkpoint/registry.hpp>
#include <accelerate/checkpoint/sharding.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/distributed/engine.hpp>
#include <accelerate/distributed/process_group.hpp>
#include <accelerate/distributed/reducer.hpp>
#include <accelerate/distributed/units.hpp>
#include <accelerate/options.hpp>
#include <accelerate/policy/backend.hpp>

namespace accelerate::distributed {

/// Whether `optimizer` updates each element from that element's gradient and state alone, so
/// that stepping a slice equals slicing the step: torch::optim SGD, Adam, AdamW, RMSprop and
/// Adagrad, the optimizers with a built-in state encoding. (LBFGS's line search, for one,
/// needs the whole gradient.)
inline bool steps_elementwise(const torch::optim::Optimizer& optimizer) {
  return accelerate::detail::try_with_state_type(optimizer, []<class>() {});
}

/// A stage-3 model's synchronisation: data parallel's (ReducerHandle) and the forward pass,
/// which gathers each unit's parameters just before it runs and releases them after.
/// LibTorch modules have no forward hooks, so the units are what can be called through us:
/// the submodules listed in DdpOptions::shard_units, which the model's forward runs through
/// accelerate::unit_forward (distributed/units.hpp), the rest of the model being gathered for
/// the whole forward; without a list, the children of a torch::nn::Sequential, run one by one
/// by the prepared model (unit k+1's all-gather is started before unit k computes; backward
/// regathers unit k from a hook on its output, while unit k-1's is prefetched, and frees it
/// once its gradients are in); or else the whole model, gathered before its forward and
/// released when backward has used it.
/// Example (each Linear is a unit):
///   auto [model, opt] = acc.prepare(torch::nn::Sequential(torch::nn::Linear(784, 4096), ...), adamw);
class ShardedModelSync : public ReducerHandle {
 public:
  ShardedModelSync() = default;
  explicit ShardedModelSync(ReducerHandle handle) : ReducerHandle(std::move(handle)) {}

  /// Runs `module`'s forward with its units gathered (the prepared model calls it).
  template <class Module, class... Args>
  decltype(auto) forward(Module& module, Args&&... args) {
    GradientReducer* reducer = this->reducer();
    if (reducer == nullptr) return module.forward(std::forward<Args>(args)...);
    if (!listed_.empty()) return listed_forward(module, std::forward<Args>(args)...);
    if constexpr (std::is_same_v<Module, torch::nn::SequentialImpl>) {
      if (reducer->unit_count() > 1 && !module.is_empty())
        return sequential_forward(module, std::forward<Args>(args)...);
    }
    for (std::size_t u = 0; u < reducer->unit_count(); ++u) reducer->prefetch_unit(u);  // all in flight,
    for (std::size_t u = 0; u < reducer->unit_count(); ++u) reducer->gather_unit(u);    // then waited for
    auto output = module.forward(std::forward<Args>(args)...);
    if (!torch::autograd::GradMode::is_enabled()) reducer->release_units();  // no backward to come
    return output;
  }

  /// DdpOptions::shard_units: the units unit_forward gathers (the rest is gathered here).
  void use_listed_units(std::vector<std::string> names) { listed_ = std::move(names); }

 private:
  // The listed units are gathered by unit_forward; the parameters outside them (the reducer's
  // last unit) for the whole forward. A listed unit called directly sees its released, empty
  // parameters, and the failing op's error says so.
  template <class Module, class... Args>
  decltype(auto) listed_forward(Module& module, Args&&... args) {
    GradientReducer* reducer = this->reducer();
    reducer->gather_unit(reducer->unit_count() - 1);
    try {
      decltype(auto) output = module.forward(std::forward<Args>(args)...);
      if (!torch::autograd::GradMode::is_enabled()) reducer->release_units();  // no backward to come
      return output;
    } catch (const c10::Error& e) {
      std::string units;
      for (const auto& name : listed_) units += (units.empty() ? "" : ", ") + name;
      accelerate::detail::fail(e.what_without_backtrace(), "\n(stage 3: the parameters of the units ", units,
                               " are gathered only inside accelerate::unit_forward(child, ...); a model's forward "
                               "calling one of them directly finds them empty)");
    }
  }

  template <class... Args>
  at::Tensor sequential_forward(torch::nn::SequentialImpl& sequential, Args&&... args) {
    const std::shared_ptr<GradientReducer>& reducer = shared_reducer();
    const bool backward = torch::autograd::GradMode::is_enabled();
    const std::size_t units = sequential.size();
    std::optional<torch::nn::AnyValue> value;
    std::size_t unit = 0;
    for (auto it = sequential.begin(); it != sequential.end(); ++it, ++unit) {
      reducer->gather_unit(unit);
      reducer->prefetch_unit(next_with_parameters(*reducer, unit, +1));
      if (unit == 0) {
        value.emplace(it->any_forward(std::forward<Args>(args)...));
      } else {
        torch::nn::AnyValue next = it->any_forward(std::move(*value));
        value.emplace(std::move(next));
      }
      at::Tensor* output = value->try_get<at::Tensor>();
      if (backward && reducer->unit_has_parameters(unit) && output != nullptr && output->requires_grad()) {
        reducer->regather_in_backward(*output, unit, next_with_parameters(*reducer, unit, -1));
      }
      // The last unit's backward comes first: it stays gathered for it.
      if (!backward || unit + 1 < units) reducer->release_unit(unit);
    }
    return value->get<at::Tensor>();
  }

  // The nearest unit after (+1) or before (-1) `unit` with parameters; unit_count() if none.
  static std::size_t next_with_parameters(const GradientReducer& reducer, std::size_t unit, int direction) {
    for (std::size_t u = unit; direction > 0 ? u + 1 < reducer.unit_count() : u > 0;) {
      u = direction > 0 ? u + 1 : u - 1;
      if (reducer.unit_has_parameters(u)) return u;
    }
    return reducer.unit_count();
  }

  std::vector<std::string> listed_;  // DdpOptions::shard_units
};

/// ZeRO stage `Stage` (1: optimizer state, 2: and gradients, 3: and parameters) over
/// `Factory`'s process group.
/// Models are prepared as with data parallel (same check, broadcast and buckets) but their
/// reducer is sharded (Sharding::optimizer_state or Sharding::gradients): rank r owns the r-th
/// slice of every gradient bucket. A prepared optimizer's param groups are narrowed to those
/// slices (adopt_optimizer), so its state holds 1/world_size of the parameters.
/// Example:
///   accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 1>> acc;   // this engine inside
template <class Factory, int Stage>
class ShardedEngine : public ProcessGroupEngine<Factory> {
  using Base = ProcessGroupEngine<Factory>;
  static_assert(Stage >= 1 && Stage <= 3, "ShardedEngine: stage 1, 2 or 3");

 public:
  static constexpr int stage = Stage;
  using ModelSync = std::conditional_t<Stage == 3, ShardedModelSync, ReducerHandle>;
  using Base::Base;

  /// As data parallel, with a sharded reducer this engine keeps, so that optimizers prepared
  /// afterwards find which slices of their parameters this rank owns.
  ModelSync make_model_sync(torch::nn::Module& module, const std::string& name,
                            const AcceleratorOptions& options) {
    constexpr Sharding sharding =
        Stage == 1 ? Sharding::optimizer_state : Stage == 2 ? Sharding::gradients : Sharding::parameters;
    // Stage 3's units: those listed, else a Sequential's children, else the whole model.
    const std::vector<std::string>& listed = Stage == 3 ? options.ddp.shard_units : std::vector<std::string>{};
    std::vector<std::string> units = listed;
    const auto unit_modules = listed_units(module, listed);
    if (Stage == 3 && listed.empty() && dynamic_cast<torch::nn::SequentialImpl*>(&module) != nullptr)
      for (const auto& child : module.named_children()) units.push_back(child.key());
    std::unordered_map<const c10::TensorImpl*, BuiltSlice> built;  // its parameters cut as built
    for (auto& p : module.parameters(true)) {
      const auto it = built_.find(p.unsafeGetTensorImpl());
      if (it == built_.end()) continue;
      built.insert(std::move(*it));
      built_.erase(it);
    }
    ReducerHandle handle = Base::make_model_sync(module, name, options, sharding, std::move(units), std::move(built));
    if (!handle.shared_reducer()) {  // one process: each parameter is its own whole shard
      for (auto& item : module.named_parameters(true))
        if (item.value().requires_grad()) whole_[item.value().unsafeGetTensorImpl()] = {name, item.key()};
    }
    if (const auto& reducer = handle.shared_reducer()) {
      models_.push_back({name, reducer});
      model_of_[&module] = models_.size() - 1;
      const auto& params = reducer->parameters();
      for (std::size_t i = 0; i < params.size(); ++i)
        owners_[params[i].unsafeGetTensorImpl()] = {models_.size() - 1, i};
      const auto& pieces = reducer->shard_piece_tensors();
      for (std::size_t k = 0; k < pieces.size(); ++k) {
        piece_of_[params[reducer->shard_pieces()[k].param].unsafeGetTensorImpl()] = {models_.size() - 1, k};
        slices_.insert(pieces[k].unsafeGetTensorImpl());
      }
    }
    ModelSync sync(std::move(handle));
    if constexpr (Stage == 3) {
      if (!listed.empty() && sync.shared_reducer()) {
        for (std::size_t u = 0; u < listed.size(); ++u)
          UnitBindings::instance().bind(unit_modules[u],
                                        {sync.shared_reducer(), u, u + 1 < listed.size() ? std::optional(u + 1) : std::nullopt,
                                         u > 0 ? std::optional(u - 1) : std::nullopt});
        sync.use_listed_units(listed);
      }
    }
    return sync;
  }

  /// Stage 3: cuts `unit`'s trainable parameters to this rank's slices the moment it is built
  /// (Accelerator::shard_unit): rank 0's values are broadcast, as prepare would, each rank
  /// keeps ceil(numel / W) of each parameter's flattened values, and the parameter becomes an
  /// empty tensor until prepare all-gathers it into its bucket (one parameter at a time). So a
  /// model built unit by unit never exists whole on any rank. A collective: every rank cuts
  /// the same units in the same order. With one process nothing is cut.
  void shard_as_built(torch::nn::Module& unit)
    requires(Stage == 3)
  {
    Communicator* comm = this->communicator();
    if (comm == nullptr) return;
    this->check_same_model(unit, "unit #" + std::to_string(units_built_++), "shard_unit");
    std::vector<at::Tensor> params;
    for (auto& p : unit.parameters(true))
      if (p.requires_grad() && p.numel() > 0) params.push_back(p);  // (one cut already is empty)
    broadcast_flat(*comm, params, 0);
    torch::NoGradGuard no_grad;
    const int64_t world = comm->world_size();
    for (auto& p : params) {
      const int64_t numel = p.numel(), length = (numel + world - 1) / world;
      const int64_t begin = std::min(numel, comm->rank() * length), end = std::min(numel, begin + length);
      at::Tensor slice = at::zeros({length}, p.options().device(this->collective_device()));
      slice.narrow(0, 0, end - begin).copy_(p.detach().reshape(-1).narrow(0, begin, end - begin));
      built_[p.unsafeGetTensorImpl()] = {std::vector<int64_t>(p.sizes().begin(), p.sizes().end()), std::move(slice)};
      p.set_data(at::empty({0}, p.options()));
    }
  }

  /// Hands the heap's free pages back to the OS (glibc's malloc_trim; elsewhere nothing).
  /// Sharded engines free and allocate unit and gradient-bucket buffers every step; glibc
  /// serves them from its free lists, which fragment, and keeps the free pieces resident: at
  /// stage 3 with 10M parameters a rank grew from 615 to 825 MB over 80 steps with 163 MB in
  /// use, and stays at about 465 MB between steps trimmed once per step (0.15 ms). On CUDA the
  /// caching allocator keeps its blocks on purpose, and none of this applies.
  static void return_free_heap_to_os() {
#if defined(__GLIBC__)
    ::malloc_trim(0);
#endif
  }

  /// The modules DdpOptions::shard_units names, checked: each a submodule of `module`, listed
  /// once, none inside another.
  static std::vector<const torch::nn::Module*> listed_units(const torch::nn::Module& module,
                                                            const std::vector<std::string>& listed) {
    std::vector<const torch::nn::Module*> found;
    if (listed.empty()) return found;
    std::map<std::string, const torch::nn::Module*> submodules;
    for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/false))
      submodules.emplace(item.key(), item.value().get());
    for (std::size_t u = 0; u < listed.size(); ++u) {
      const auto it = submodules.find(listed[u]);
      if (it == submodules.end()) {
        std::string children;
        for (const auto& child : module.named_children()) children += (children.empty() ? "" : ", ") + child.key();
        accelerate::detail::fail("ddp.shard_units: the model has no submodule '", listed[u], "' (its children: ",
                                 children.empty() ? std::string("none") : children, ")");
      }
      for (std::size_t v = 0; v < listed.size(); ++v) {
        ACCELERATE_CHECK(v == u || listed[v] != listed[u], "ddp.shard_units: '", listed[u], "' is listed twice");
        ACCELERATE_CHECK(v == u || listed[u].rfind(listed[v] + ".", 0) != 0, "ddp.shard_units: '", listed[u],
                         "' lies inside '", listed[v], "'; units must not overlap");
      }
      found.push_back(it->second);
    }
    return found;
  }

  /// free_memory(): forgets every prepared model and optimizer. Their prepared objects must not
  /// be used afterwards (the shards they step are no longer known here).
  void release_prepared() {
    for (const auto& entry : models_) UnitBindings::instance().unbind(entry.reducer.get());
    models_.clear();
    model_of_.clear();
    owners_.clear();
    piece_of_.clear();
    whole_.clear();
    slices_.clear();
    shards_.clear();
    built_.clear();
  }

  /// Narrows the optimizer's param groups to this rank's slices of its parameters (1-D views
  /// of their storage; a parameter this rank owns nothing of leaves its groups), slicing any
  /// state it already holds (Adagrad's accumulators). Frozen parameters stay as they are.
  void adopt_optimizer(torch::optim::Optimizer& optimizer) {
    if (!this->communicator()) {  // one process: the whole optimizer is its shard
      OptimizerShard shard;
      int64_t index = 0;
      for (auto& group : optimizer.param_groups())
        for (auto& param : group.params()) {
          if (const auto whole = whole_.find(param.unsafeGetTensorImpl()); whole != whole_.end())
            shard.pieces.push_back({whole->second.first, whole->second.second,
                                    std::vector<int64_t>(param.sizes().begin(), param.sizes().end()), 0,
                                    param.numel(), index});
          ++index;
        }
      shards_[&optimizer] = std::move(shard);
      return;
    }
    ACCELERATE_CHECK(steps_elementwise(optimizer), "prepare: ", name(), " shards the optimizer state, which "
                     "needs an element-wise optimizer (torch::optim SGD, Adam, AdamW, RMSprop or Adagrad); "
                     "use accelerate::Gloo or accelerate::Nccl (data parallel) for this optimizer");
    OptimizerShard shard;
    std::set<std::pair<std::size_t, std::size_t>> buckets;  // (model, bucket): ordered alike on every rank
    int64_t group_base = 0;  // state index of the group's first parameter in the narrowed optimizer
    accelerate::detail::with_state_type(optimizer, [&]<class State>() {
      for (auto& group : optimizer.param_groups()) {
        std::vector<at::Tensor> kept;
        for (auto& param : group.params()) {
          const auto owner = owners_.find(param.unsafeGetTensorImpl());
          if (owner == owners_.end()) {
            ACCELERATE_CHECK(!param.requires_grad(), "prepare: the optimizer holds a parameter of shape ",
                             param.sizes(), " that belongs to no model prepared before it; with ", name(),
                             " prepare each model before its optimizers (acc.prepare(model, optimizer))");
            kept.push_back(param);  // frozen: never stepped, stays whole
            continue;
          }
          const auto [model, index] = owner->second;
          const GradientReducer& reducer = *models_[model].reducer;
          buckets.insert({model, reducer.bucket_of(index)});
          shard.model_params.push_back(param);
          auto& states = optimizer.state();
          const bool has_state = states.count(param.unsafeGetTensorImpl()) > 0;
          const auto piece = piece_of_.find(param.unsafeGetTensorImpl());
          if (piece != piece_of_.end()) {
            const ShardPiece& where = reducer.shard_pieces()[piece->second.second];
            const at::Tensor& slice = reducer.shard_piece_tensors()[piece->second.second];
            if (has_state) {
              auto sliced = sliced_state<State>(*states.at(param.unsafeGetTensorImpl()), where);
              states[slice.unsafeGetTensorImpl()] = std::move(sliced);
            }
            kept.push_back(slice);
            shard.pieces.push_back({models_[model].name, reducer.names()[index], reducer.shape_of(index),
                                    where.begin, where.length, group_base + static_cast<int64_t>(kept.size()) - 1});
          }
          if (has_state) states.erase(param.unsafeGetTensorImpl());
        }
        group_base += static_cast<int64_t>(kept.size());
        group.params() = std::move(kept);
      }
    });
    shard.buckets.assign(buckets.begin(), buckets.end());
    shards_[&optimizer] = std::move(shard);
  }

  /// Steps this rank's slices, then all-gathers every bucket holding the optimizer's
  /// parameters, so each rank's model is whole and the same again. Stage 3 gathers nothing:
  /// the next forward does, unit by unit (a unit still gathered is released, being stale).
  void step_optimizer(torch::optim::Optimizer& optimizer) {
    optimizer.step();
    const auto shard = shards_.find(&optimizer);
    if (shard == shards_.end()) return;
    for (const auto& [model, bucket] : shard->second.buckets) {
      if constexpr (Stage == 3) models_[model].reducer->release_units();
      else models_[model].reducer->gather_parameters(bucket);
    }
    if (this->collective_device().is_cpu()) return_free_heap_to_os();
  }

  /// A prepared optimizer's zero_grad: its slices' gradients, and the local gradients of the
  /// model parameters it was built over (accumulated off the boundary, where no slice holds
  /// them yet), which data parallel's zero_grad clears too.
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) {
    optimizer.zero_grad(set_to_none);
    const auto shard = shards_.find(&optimizer);
    if (shard == shards_.end()) return;
    for (auto& param : shard->second.model_params) {
      at::Tensor& grad = param.mutable_grad();
      if (!grad.defined()) continue;
      grad.detach_();  // as torch::optim::Optimizer::zero_grad
      if (set_to_none) grad.reset();
      else grad.zero_();
    }
  }

  /// Stage 3: the model's parameters gathered unit by unit (a collective: every rank calls
  /// it), copied out, with its buffers and frozen parameters, in state_dict order.
  std::vector<std::pair<std::string, at::Tensor>> full_model_state(const torch::nn::Module& module)
    requires(Stage == 3)
  {
    auto state = checkpoint::named_tensors(module);
    const auto found = model_of_.find(&module);
    if (found == model_of_.end()) return state;  // one process: the parameters are whole
    GradientReducer& reducer = *models_[found->second].reducer;
    std::map<std::string, at::Tensor> whole;
    for (std::size_t u = 0; u < reducer.unit_count(); ++u) {
      if (!reducer.unit_has_parameters(u)) continue;
      const bool was_gathered = reducer.unit_gathered(u);
      reducer.gather_unit(u);
      for (const std::size_t index : reducer.unit_parameters(u))
        whole[reducer.names()[index]] = reducer.parameters()[index].detach().clone();
      if (!was_gathered) reducer.release_unit(u);
    }
    for (auto& [name, tensor] : state)
      if (const auto it = whole.find(name); it != whole.end()) tensor = it->second;
    return state;
  }

  /// Stage 3: save_model streams the model to rank 0 one output shard at a time. Every rank
  /// plans the same files from the parameters' shapes; for each shard every rank sends rank 0
  /// its slices of the shard's parameters (point to point, straight from the slices it keeps)
  /// and rank 0 receives them into the full tensors, writes the shard and drops them. So rank 0
  /// holds at most one output shard of the gathered model at a time, the others none, and the
  /// model crosses the wire once (an all-gather would move it to every rank). The ranks agree
  /// after each step (a one-element all-reduce): a write failing on rank 0 (disk full, a file
  /// in the way) ends save_model on every rank with an error and leaves the folder as it was.
  void save_model_files(const torch::nn::Module& module, const std::filesystem::path& dir,
                        const SaveModelOptions& options)
    requires(Stage == 3)
  {
    const auto found = model_of_.find(&module);
    if (found == model_of_.end()) {  // one process, or a model this engine holds whole
      if (this->rank() == 0) checkpoint::write_model_files(checkpoint::named_tensors(module), dir, options);
      return;
    }
    const std::size_t model = found->second;
    GradientReducer& reducer = *models_[model].reducer;
    Communicator& comm = *this->communicator();
    const int rank = this->rank();
    const bool writes = rank == 0;

    // The sharded parameters by name (tied names share one), and every tensor's spec.
    std::map<const c10::TensorImpl*, std::size_t> index_of;
    for (std::size_t i = 0; i < reducer.parameters().size(); ++i)
      index_of[reducer.parameters()[i].unsafeGetTensorImpl()] = i;
    std::map<std::string, std::size_t> sharded;
    for (const auto& item : module.named_parameters(/*recurse=*/true))
      if (const auto it = index_of.find(item.value().unsafeGetTensorImpl()); it != index_of.end())
        sharded[item.key()] = it->second;
    const auto state = checkpoint::named_tensors(module);  // state_dict order; buffers are whole
    std::vector<checkpoint::TensorSpec> specs;
    for (const auto& [name, tensor] : state) {
      const auto it = sharded.find(name);
      if (it == sharded.end()) specs.push_back(checkpoint::spec_of(name, tensor));
      else specs.push_back({name, reducer.shape_of(it->second), reducer.parameters()[it->second].scalar_type(),
                            &reducer.parameters()[it->second]});
    }
    // Planned alike on every rank (a bad size fails everywhere, before any collective).
    const auto plan = checkpoint::split_into_shards(specs, checkpoint::shard_size_bytes(options.max_shard_size), nullptr);

    std::optional<checkpoint::ModelFilesWriter> writer;
    std::exception_ptr failure;
    const auto flag_options = at::TensorOptions(at::kInt).device(reducer.parameters().front().device());
    auto agree = [&](const std::string& doing) {
      at::Tensor failed = at::full({1}, failure ? 1 : 0, flag_options);
      comm.all_reduce(failed, Reduction::max);
      if (failed.item<int>() == 0) return;
      if (failure) std::rethrow_exception(failure);
      accelerate::detail::fail("save_model: rank 0 failed ", doing, " in ", dir.string(),
                               " (its error names the cause); the folder is as it was");
    };
    if (writes) {
      try {
        writer.emplace(dir, specs, options);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    agree("preparing the files");

    const std::map<std::string, at::Tensor> whole(state.begin(), state.end());
    int tag = 0;  // one per (parameter, rank) pair, counted alike on every rank
    for (std::size_t s = 0; s < plan.size(); ++s) {
      std::map<std::string, at::Tensor> tensors;  // rank 0: this shard's tensors
      std::vector<InFlight> transfers;
      std::vector<at::Tensor> buffers;  // alive until their transfers are done
      torch::NoGradGuard no_grad;
      for (const auto& name : plan[s].names) {
        const auto it = sharded.find(name);
        if (it == sharded.end()) {
          if (writes) tensors[name] = whole.at(name);
          continue;
        }
        const std::size_t index = it->second;
        const at::Tensor& param = reducer.parameters()[index];
        at::Tensor full;
        if (writes) full = at::empty(reducer.shape_of(index), at::TensorOptions(param.scalar_type()).device(param.device()));
        for (int r = 0; r < this->world_size(); ++r, ++tag) {
          const auto [begin, end] = reducer.held_by(index, r);
          if (begin == end || (!writes && r != rank)) continue;
          if (r == rank) {
            const auto piece = piece_of_.find(param.unsafeGetTensorImpl());
            ACCELERATE_CHECK(piece != piece_of_.end() && piece->second.first == model &&
                                 reducer.shard_pieces()[piece->second.second].begin == begin &&
                                 reducer.shard_pieces()[piece->second.second].length == end - begin,
                             "save_model: rank ", rank, " does not hold the slice [", begin, ", ", end, ") of ", name,
                             " it should");
            at::Tensor mine = reducer.shard_piece_tensors()[piece->second.second];
            if (writes) full.view(-1).narrow(0, begin, end - begin).copy_(mine);
            else transfers.push_back(comm.send_async(mine, 0, tag));
            buffers.push_back(std::move(mine));
          } else {
            at::Tensor into = full.view(-1).narrow(0, begin, end - begin);
            transfers.push_back(comm.recv_async(into, r, tag));
            buffers.push_back(std::move(into));
          }
        }
        if (writes) tensors[name] = std::move(full);
      }
      for (const auto& transfer : transfers)
        comm.wait(transfer, writes ? "save_model: receiving parameter slices" : "save_model: sending parameter slices");
      if (writes) {
        try {
          writer->write_shard(s, tensors);
        } catch (...) {
          failure = std::current_exception();
        }
      }
      agree("writing shard " + std::to_string(s + 1) + " of " + std::to_string(plan.size()));
    }
    if (writes) {
      try {
        writer->commit();
      } catch (...) {
        failure = std::current_exception();
      }
    }
    agree("publishing the folder");
  }

  /// Stage 3: a prepared model's checkpoint entry is each rank's own (model_rank<r>): its
  /// slices of the parameters under their names (1-D), the buffers and frozen parameters
  /// whole, and a manifest under "shards" as the optimizer's (parameter, global shape, flat
  /// range). Loading checks it first; another world size is re-cut from every saved rank.
  checkpoint::Entry model_entry(const torch::nn::Module& module, checkpoint::Entry entry)
    requires(Stage == 3)
  {
    const auto found = model_of_.find(&module);
    if (found == model_of_.end()) return this->communicator() ? entry : whole_model_entry(module);
    std::shared_ptr<GradientReducer> reducer = models_[found->second].reducer;
    nlohmann::json manifest = {{"stage", Stage}, {"world_size", this->world_size()}, {"rank", this->rank()}};
    nlohmann::json pieces = nlohmann::json::array();
    for (const auto& piece : reducer->shard_pieces())
      pieces.push_back({{"parameter", reducer->names()[piece.param]}, {"shape", reducer->shape_of(piece.param)},
                        {"offset", piece.begin}, {"numel", piece.length}});
    manifest["pieces"] = std::move(pieces);
    const torch::nn::Module* target = &module;
    // The parameters saved as slices; the rest (buffers, frozen parameters) is saved whole.
    const auto sharded = std::make_shared<const std::set<std::string>>(reducer->names().begin(), reducer->names().end());
    entry.owner = checkpoint::EntryOwner::every_rank;
    entry.save = [reducer, manifest, target, sharded] {
      StateDict state;
      for (const auto& [name, tensor] : checkpoint::named_tensors(*target))
        if (!sharded->count(name)) state.tensors[name] = tensor;
      for (std::size_t k = 0; k < reducer->shard_pieces().size(); ++k)
        state.tensors[reducer->names()[reducer->shard_pieces()[k].param]] = reducer->shard_piece_tensors()[k].detach();
      state.values["shards"] = manifest;
      return state;
    };
    auto check = [reducer, manifest, target, sharded](const StateDict& saved) {
      ACCELERATE_CHECK(saved.values.contains("shards") && saved.values.at("shards") == manifest,
                       "sharded model state: saved with the slices ",
                       saved.values.contains("shards") ? saved.values.at("shards").dump() : std::string("(none)"),
                       ", this rank holds ", manifest.dump(), " (another model, bucket size or number of processes?)");
      for (const auto& [name, tensor] : checkpoint::named_tensors(*target)) {
        if (sharded->count(name)) continue;
        const auto it = saved.tensors.find(name);
        ACCELERATE_CHECK(it != saved.tensors.end() && it->second.sizes() == tensor.sizes(),
                         "sharded model state: ", name, " is missing or has another shape");
      }
      for (std::size_t k = 0; k < reducer->shard_pieces().size(); ++k) {
        const std::string& name = reducer->names()[reducer->shard_pieces()[k].param];
        const auto it = saved.tensors.find(name);
        ACCELERATE_CHECK(it != saved.tensors.end() && it->second.numel() == reducer->shard_pieces()[k].length,
                         "sharded model state: the slice of ", name, " is missing or has another length");
      }
    };
    entry.check = check;
    entry.load = [reducer, target, check, sharded](const StateDict& saved) {
      check(saved);
      torch::NoGradGuard no_grad;
      for (auto& [name, tensor] : checkpoint::named_tensors(*target))
        if (!sharded->count(name)) tensor.copy_(saved.tensors.at(name));
      for (std::size_t k = 0; k < reducer->shard_pieces().size(); ++k) {
        at::Tensor piece = reducer->shard_piece_tensors()[k];
        piece.copy_(saved.tensors.at(reducer->names()[reducer->shard_pieces()[k].param]).reshape(-1));
      }
      reducer->release_units();  // a unit left gathered holds the old values
    };
    entry.reshard = [manifest](const std::vector<StateDict>& saved) { return resharded_model_state(manifest, saved); };
    entry.laid_out_otherwise = [manifest](const StateDict& saved) { return cut_otherwise(manifest, saved); };
    return entry;
  }

  /// Stage 3 in one process: the model entry of a world of one, whose rank holds every
  /// trainable parameter whole (shape kept, offset 0), under the same manifest as several
  /// processes write. So a checkpoint moves between one process and several both ways:
  /// resharded_model_state re-cuts either into the other, bit for bit.
  static checkpoint::Entry whole_model_entry(const torch::nn::Module& module) {
    nlohmann::json pieces = nlohmann::json::array();
    auto sharded = std::make_shared<std::set<std::string>>();
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      if (!item.value().requires_grad()) continue;
      const auto sizes = item.value().sizes();
      pieces.push_back({{"parameter", item.key()}, {"shape", std::vector<int64_t>(sizes.begin(), sizes.end())},
                        {"offset", 0}, {"numel", item.value().numel()}});
      sharded->insert(item.key());
    }
    const nlohmann::json manifest = {{"stage", Stage}, {"world_size", 1}, {"rank", 0}, {"pieces", std::move(pieces)}};
    const torch::nn::Module* target = &module;
    checkpoint::Entry entry{checkpoint::Entry::Kind::model, checkpoint::EntryOwner::every_rank};
    entry.save = [target, manifest] {
      StateDict state;
      for (const auto& [name, tensor] : checkpoint::named_tensors(*target)) state.tensors[name] = tensor;
      state.values["shards"] = manifest;
      return state;
    };
    auto check = [target, manifest, sharded](const StateDict& saved) {
      ACCELERATE_CHECK(saved.values.contains("shards") && saved.values.at("shards") == manifest,
                       "sharded model state: saved with the slices ",
                       saved.values.contains("shards") ? saved.values.at("shards").dump() : std::string("(none)"),
                       ", this process holds ", manifest.dump(), " (another model?)");
      for (const auto& [name, tensor] : checkpoint::named_tensors(*target)) {
        const auto it = saved.tensors.find(name);
        // A re-cut parameter comes flattened; buffers and frozen parameters keep their shape.
        ACCELERATE_CHECK(it != saved.tensors.end() && (sharded->count(name) ? it->second.numel() == tensor.numel()
                                                                            : it->second.sizes() == tensor.sizes()),
                         "sharded model state: ", name, " is missing or has another shape");
      }
    };
    entry.check = check;
    entry.load = [target, check](const StateDict& saved) {
      check(saved);
      torch::NoGradGuard no_grad;
      for (auto& [name, tensor] : checkpoint::named_tensors(*target))
        tensor.copy_(saved.tensors.at(name).reshape(tensor.sizes()));
    };
    entry.reshard = [manifest](const std::vector<StateDict>& saved) { return resharded_model_state(manifest, saved); };
    entry.laid_out_otherwise = [manifest](const StateDict& saved) { return cut_otherwise(manifest, saved); };
    return entry;
  }

  /// This rank's slices of `params`: a model parameter becomes the slice of it this rank
  /// owns (none when it owns nothing of it); slices and frozen parameters stay as they are.
  std::vector<at::Tensor> gradient_holders(const std::vector<at::Tensor>& params) const {
    std::vector<at::Tensor> holders;
    std::set<const c10::TensorImpl*> seen;
    for (const auto& param : params) {
      at::Tensor holder = param;
      if (const auto piece = piece_of_.find(param.unsafeGetTensorImpl()); piece != piece_of_.end())
        holder = models_[piece->second.first].reducer->shard_piece_tensors()[piece->second.second];
      else if (owners_.count(param.unsafeGetTensorImpl()))
        continue;  // a model parameter this rank owns no slice of
      if (seen.insert(holder.unsafeGetTensorImpl()).second) holders.push_back(holder);
    }
    return holders;
  }

  /// The global `norm_type`-norm of the gradients of `params` (model parameters or the
  /// optimizer's slices): each rank adds up its slices' part, one all-reduce combines them
  /// (sum of p-th powers, or max), and every rank scales its slices by the same factor.
  double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm, double norm_type) {
    // One process holds every gradient whole: SingleProcess's clipping, bit for bit.
    if (!this->communicator()) return torch::nn::utils::clip_grad_norm_(params, max_norm, norm_type);
    std::vector<at::Tensor> grads;
    for (const auto& holder : gradient_holders(params)) {
      if (!holder.grad().defined()) continue;
      ACCELERATE_CHECK(slices_.count(holder.unsafeGetTensorImpl()) > 0, "clip_grad_norm_ (", name(), ", rank ", this->rank(), "): a tensor of "
                       "shape ", holder.sizes(), " has a gradient but is not a parameter of a prepared model, "
                       "so its share of the global norm is unknown");
      grads.push_back(holder.grad());
    }
    const bool infinity = std::isinf(norm_type);
    at::Tensor part = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(this->collective_device()));
    for (const auto& g : grads) {
      at::Tensor local = g.detach().to(part.device(), at::kDouble);
      if (infinity) part = at::maximum(part, local.abs().max().reshape({1}));
      else part.add_(local.abs().pow(norm_type).sum());
    }
    this->all_reduce(part, infinity ? Reduction::max : Reduction::sum);
    const double sum = part.cpu().item<double>();
    const double total = infinity ? sum : std::pow(sum, 1.0 / norm_type);
    // torch's rule (clip_grad_norm_, what data parallel runs): the coefficient clamped to at
    // most 1 and applied whatever it is, so a NaN or infinite norm reaches every gradient
    // (min(NaN, 1) is NaN). Multiplying by exactly 1 changes nothing, so that is skipped.
    const double coefficient = std::min(max_norm / (total + 1e-6), 1.0);
    if (coefficient != 1.0) {
      torch::NoGradGuard no_grad;
      for (auto& g : grads) g.mul_(coefficient);
    }
    return total;
  }

  /// Every rank skips an fp16 step when any rank's slices held an inf or NaN.
  void agree_on_found_inf(at::Tensor& found_inf) {
    if (!this->communicator()) return;
    this->all_reduce(found_inf, Reduction::max);
  }

  /// A prepared optimizer's checkpoint entry: each rank writes its own shard
  /// (optimizer_<i>_rank<r>), whose JSON carries a manifest under "shards": the stage, the
  /// world size, this rank, and for each slice the model, parameter name, global shape, the
  /// flat range [offset, offset + numel) it holds and its index in the optimizer's state.
  /// Loading checks the manifest first; a checkpoint of another world size (or stage) is
  /// re-cut from every saved rank's slices (resharded_state).
  checkpoint::Entry optimizer_entry(const torch::optim::Optimizer& optimizer, checkpoint::Entry entry) {
    const auto shard = shards_.find(&optimizer);
    if (shard == shards_.end()) return entry;
    nlohmann::json manifest = {{"stage", Stage}, {"world_size", this->world_size()}, {"rank", this->rank()}};
    nlohmann::json pieces = nlohmann::json::array();
    for (const auto& piece : shard->second.pieces)
      pieces.push_back({{"model", piece.model}, {"parameter", piece.parameter}, {"shape", piece.shape},
                        {"offset", piece.offset}, {"numel", piece.numel}, {"index", piece.index}});
    manifest["pieces"] = std::move(pieces);
    auto verify = [manifest](const StateDict& saved) { check_manifest(manifest, saved); };
    entry.owner = checkpoint::EntryOwner::every_rank;
    entry.save = [save = std::move(entry.save), manifest] {
      StateDict state = save();
      state.values["shards"] = manifest;
      return state;
    };
    entry.load = [load = std::move(entry.load), verify](const StateDict& saved) {
      verify(saved);
      load(saved);
    };
    entry.check = [check = std::move(entry.check), verify](const StateDict& saved) {
      verify(saved);
      if (check) check(saved);
    };
    entry.reshard = [manifest, &optimizer](const std::vector<StateDict>& saved) {
      return resharded_state(manifest, optimizer, saved);
    };
    entry.laid_out_otherwise = [manifest](const StateDict& saved) { return cut_otherwise(manifest, saved); };
    return entry;
  }

 private:
  struct Model {
    std::string name;
    std::shared_ptr<GradientReducer> reducer;
  };
  struct PieceRecord {
    std::string model;
    std::string parameter;
    std::vector<int64_t> shape;
    int64_t offset;
    int64_t numel;
    int64_t index;  // in the optimizer's state order ("state.<index>.<name>")
  };
  struct OptimizerShard {
    std::vector<PieceRecord> pieces;                         // in the optimizer's state order
    std::vector<at::Tensor> model_params;                    // the model parameters it was built over
    std::vector<std::pair<std::size_t, std::size_t>> buckets;  // (model, bucket) to all-gather
  };

  static std::string name() { return "Zero stage " + std::to_string(Stage); }

  // The state of a whole parameter, cut to the slice `where` (tensors flattened).
  template <class State>
  static std::unique_ptr<torch::optim::OptimizerParamState> sliced_state(
      torch::optim::OptimizerParamState& whole, const ShardPiece& where) {
    using Fields = accelerate::detail::ParamStateFields<State>;
    auto* typed = dynamic_cast<State*>(&whole);
    ACCELERATE_CHECK(typed != nullptr, "prepare: the optimizer's state is not ", Fields::name, " state");
    auto out = std::make_unique<State>();
    std::map<std::string, int64_t> integers;
    Fields::integers(*typed, [&](const char* key, auto get, auto) { integers[key] = get(); });
    Fields::integers(*out, [&](const char* key, auto, auto set) { set(integers.at(key)); });
    std::map<std::string, at::Tensor> tensors;
    Fields::tensors(*typed, [&](const char* key, auto get, auto) {
      if (get().defined()) tensors[key] = get().detach().reshape(-1).narrow(0, where.begin, where.length).clone();
    });
    Fields::tensors(*out, [&](const char* key, auto, auto set) {
      if (tensors.count(key)) set(tensors.at(key));
    });
    return out;
  }

  // This rank's optimizer state, in the layout `mine` describes, assembled from the slices
  // every saved rank held (a checkpoint of another world size or stage): each state tensor of
  // each of this rank's slices is copied together from the saved slices of the same
  // parameter that overlap it; step counts and hyperparameters are the saved ones.
  static StateDict resharded_state(const nlohmann::json& mine, const torch::optim::Optimizer& optimizer,
                                   const std::vector<StateDict>& saved) {
    struct Source {
      const StateDict* state;
      std::string index;
      int64_t offset, numel;
      std::vector<int64_t> shape;
    };
    std::map<std::pair<std::string, std::string>, std::vector<Source>> sources;  // (model, parameter)
    for (std::size_t r = 0; r < saved.size(); ++r) {
      const auto& values = saved[r].values;
      ACCELERATE_CHECK(values.contains("shards") && values.contains("state") && values.contains("param_groups"),
                       "sharded optimizer state of saved rank ", r, ": no \"shards\" manifest, state or param_groups "
                       "(saved by a data-parallel run?)");
      ACCELERATE_CHECK(values.value("type", "") == saved[0].values.value("type", ""), "sharded optimizer state: saved "
                       "rank ", r, " holds ", values.value("type", ""), " state, rank 0 ", saved[0].values.value("type", ""));
      for (const auto& piece : values.at("shards").at("pieces")) {
        ACCELERATE_CHECK(piece.contains("index"), "sharded optimizer state of saved rank ", r, ": its slices do not "
                         "record their state index (saved by an older version), so it cannot be re-cut");
        sources[{piece.at("model").get<std::string>(), piece.at("parameter").get<std::string>()}].push_back(
            {&saved[r], std::to_string(piece.at("index").get<int64_t>()), piece.at("offset").get<int64_t>(),
             piece.at("numel").get<int64_t>(), piece.at("shape").get<std::vector<int64_t>>()});
      }
    }
    std::vector<at::Tensor> params;  // this optimizer's, in state order
    for (const auto& group : optimizer.param_groups())
      for (const auto& p : group.params()) params.push_back(p);

    StateDict out;
    out.values["type"] = saved[0].values.value("type", "");
    out.values["shards"] = mine;
    auto groups = saved[0].values.at("param_groups");
    ACCELERATE_CHECK(groups.is_array() && groups.size() == optimizer.param_groups().size(), "sharded optimizer state: ",
                     groups.size(), " param groups saved, the optimizer has ", optimizer.param_groups().size());
    int64_t index = 0;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      nlohmann::json indices = nlohmann::json::array();
      for (std::size_t i = 0; i < optimizer.param_groups()[g].params().size(); ++i) indices.push_back(index++);
      groups[g]["params"] = indices;
    }
    out.values["param_groups"] = groups;
    nlohmann::json states = nlohmann::json::object();
    for (const auto& piece : mine.at("pieces")) {
      const auto model = piece.at("model").get<std::string>(), parameter = piece.at("parameter").get<std::string>();
      const auto shape = piece.at("shape").get<std::vector<int64_t>>();
      const auto begin = piece.at("offset").get<int64_t>(), numel = piece.at("numel").get<int64_t>(),
                 my_index = piece.at("index").get<int64_t>();
      const auto found = sources.find({model, parameter});
      ACCELERATE_CHECK(found != sources.end(), "sharded optimizer state: no saved rank holds a slice of ", model,
                       ".", parameter);
      std::vector<const Source*> overlapping;
      for (const auto& source : found->second) {
        ACCELERATE_CHECK(source.shape == shape, "sharded optimizer state: ", model, ".", parameter, " was saved with "
                         "shape ", nlohmann::json(source.shape).dump(), ", this model's is ", nlohmann::json(shape).dump());
        if (source.offset < begin + numel && begin < source.offset + source.numel) overlapping.push_back(&source);
      }
      const auto stepped = [](const Source* s) { return s->state->values.at("state").contains(s->index); };
      const auto with_state = std::count_if(overlapping.begin(), overlapping.end(), stepped);
      if (with_state == 0) continue;  // never stepped
      ACCELERATE_CHECK(with_state == static_cast<std::ptrdiff_t>(overlapping.size()), "sharded optimizer state: ",
                       "some saved slices of ", model, ".", parameter, " have optimizer state and some do not");
      const std::string key = std::to_string(my_index);
      states[key] = overlapping.front()->state->values.at("state").at(overlapping.front()->index);
      ACCELERATE_CHECK(my_index >= 0 && my_index < static_cast<int64_t>(params.size()), "sharded optimizer state: ",
                       "state index ", my_index, " is outside the optimizer's ", params.size(), " parameters");
      std::map<std::string, std::vector<SavedSlice>> fields;  // state name -> the saved slices of it
      for (const Source* source : overlapping) {
        const std::string prefix = "state." + source->index + ".";
        for (const auto& [name, tensor] : source->state->tensors) {
          if (!name.starts_with(prefix)) continue;
          ACCELERATE_CHECK(tensor.numel() == source->numel, "sharded optimizer state: ", name, " has ",
                           tensor.numel(), " elements, its slice of ", model, ".", parameter, " ", source->numel);
          fields[name.substr(prefix.size())].push_back({source->offset, source->numel, tensor});
        }
      }
      for (const auto& [field, slices] : fields)
        out.tensors["state." + key + "." + field] =
            assembled_slice(begin, numel, slices, "sharded optimizer state: " + model + "." + parameter + " (" + field + ")")
                .reshape(params[static_cast<std::size_t>(my_index)].sizes());
    }
    out.values["state"] = states;
    return out;
  }

  // Stage 3: this rank's parameter slices (as `mine` lists them) copied together from the
  // saved ranks' slices that overlap them; buffers and frozen parameters from saved rank 0.
  static StateDict resharded_model_state(const nlohmann::json& mine, const std::vector<StateDict>& saved) {
    StateDict out;
    out.values["shards"] = mine;
    std::set<std::string> sharded;
    for (const auto& piece : mine.at("pieces")) sharded.insert(piece.at("parameter").get<std::string>());
    for (std::size_t r = 0; r < saved.size(); ++r)
      ACCELERATE_CHECK(saved[r].values.contains("shards"), "sharded model state of saved rank ", r,
                       ": no \"shards\" manifest");
    for (const auto& [name, tensor] : saved.front().tensors) {
      bool is_slice = sharded.count(name) > 0;
      for (const auto& piece : saved.front().values.at("shards").at("pieces"))
        is_slice = is_slice || piece.at("parameter") == name;
      if (!is_slice) out.tensors[name] = tensor;
    }
    for (const auto& piece : mine.at("pieces")) {
      const auto name = piece.at("parameter").get<std::string>();
      std::vector<SavedSlice> slices;
      for (std::size_t r = 0; r < saved.size(); ++r)
        for (const auto& theirs : saved[r].values.at("shards").at("pieces")) {
          if (theirs.at("parameter") != name) continue;
          const int64_t length = theirs.at("numel").get<int64_t>();
          const auto it = saved[r].tensors.find(name);
          ACCELERATE_CHECK(it != saved[r].tensors.end() && it->second.numel() == length, "sharded model state of "
                           "saved rank ", r, ": the slice of ", name, " is missing or has another length");
          slices.push_back({theirs.at("offset").get<int64_t>(), length, it->second});
        }
      out.tensors[name] = assembled_slice(piece.at("offset").get<int64_t>(), piece.at("numel").get<int64_t>(), slices,
                                          "sharded model state: " + name);
    }
    return out;
  }

  // A saved slice of a flattened parameter: elements [offset, offset + numel), in `tensor`.
  struct SavedSlice {
    int64_t offset;
    int64_t numel;
    at::Tensor tensor;
  };

  // Elements [begin, begin + numel) of a flattened parameter, copied together from the saved
  // `slices` that overlap them; an error naming `what` unless they cover every element.
  static at::Tensor assembled_slice(int64_t begin, int64_t numel, const std::vector<SavedSlice>& slices,
                                    const std::string& what) {
    at::Tensor out;
    int64_t covered = 0;
    for (const auto& slice : slices) {
      const int64_t from = std::max(begin, slice.offset), to = std::min(begin + numel, slice.offset + slice.numel);
      if (from >= to) continue;
      if (!out.defined()) out = at::zeros({numel}, slice.tensor.options());
      out.narrow(0, from - begin, to - from).copy_(slice.tensor.reshape(-1).narrow(0, from - slice.offset, to - from));
      covered += to - from;
    }
    ACCELERATE_CHECK(covered == numel, what, ": the saved slices cover ", covered, " of the ", numel, " elements [",
                     begin, ", ", begin + numel, ")");
    return out;
  }

  // Whether a state saved by the same number of processes was cut otherwise than `mine` (another
  // stage, bucket size or model): load_state re-cuts it from every saved rank's slices, as for
  // another number of processes, rather than refusing at one world size what it re-cuts at another.
  static bool cut_otherwise(const nlohmann::json& mine, const StateDict& saved) {
    if (!saved.values.contains("shards")) return false;  // not sharded: the check names it
    const auto& found = saved.values.at("shards");
    return found.value("world_size", nlohmann::json()) == mine.at("world_size") &&
           (found.value("stage", nlohmann::json()) != mine.at("stage") ||
            found.value("pieces", nlohmann::json()) != mine.at("pieces"));
  }

  static void check_manifest(const nlohmann::json& expected, const StateDict& saved) {
    ACCELERATE_CHECK(saved.values.contains("shards"), "sharded optimizer state: the saved state has no "
                     "\"shards\" manifest (saved by a data-parallel run?); it cannot be loaded into ",
                     "Zero stage ", Stage);
    const auto& found = saved.values.at("shards");
    for (const char* key : {"stage", "world_size", "rank"})
      ACCELERATE_CHECK(found.contains(key) && found.at(key) == expected.at(key),
                       "sharded optimizer state: saved with ", key, " ", found.value(key, nlohmann::json()).dump(),
                       ", this run has ", expected.at(key).dump(), " (a sharded optimizer resumes on the same "
                       "stage; another number of processes needs LoadStateOptions::allow_world_size_change)");
    const auto& mine = expected.at("pieces");
    const auto& theirs = found.value("pieces", nlohmann::json::array());
    ACCELERATE_CHECK(theirs.size() == mine.size(), "sharded optimizer state: ", theirs.size(),
                     " slices saved, this rank holds ", mine.size(), " (another model or bucket size?)");
    for (std::size_t i = 0; i < mine.size(); ++i)
      ACCELERATE_CHECK(theirs[i] == mine[i], "sharded optimizer state: slice ", i, " was saved as ",
                       theirs[i].dump(), ", this rank holds ", mine[i].dump());
  }

  std::vector<Model> models_;  // (release_prepared() clears this and every map below)
  std::map<const torch::nn::Module*, std::size_t> model_of_;  // prepared module -> index in models_
  // Model parameter -> (model, index in its reducer), and -> (model, index of this rank's slice).
  std::map<const c10::TensorImpl*, std::pair<std::size_t, std::size_t>> owners_;
  std::map<const c10::TensorImpl*, std::pair<std::size_t, std::size_t>> piece_of_;
  // One process: model parameter -> (model, parameter name), each its own whole shard.
  std::map<const c10::TensorImpl*, std::pair<std::string, std::string>> whole_;
  std::set<const c10::TensorImpl*> slices_;  // every slice tensor (clip_grad_norm_ looks them up each step)
  std::map<const torch::optim::Optimizer*, OptimizerShard> shards_;
  // Stage 3: parameters cut as they were built, until the model holding them is prepared.
  std::unordered_map<const c10::TensorImpl*, BuiltSlice> built_;
  std::size_t units_built_ = 0;
};

}  // namespace accelerate::distributed

namespace accelerate::detail {

template <int Stage>
struct backend_engine<Zero<Gloo, Stage>> {  // Stage 1, 2 or 3
  using type = distributed::ShardedEngine<distributed::GlooFactory, Stage>;
  static_assert(distributed::BackendEngine<type>);
};

}  // namespace accelerate::detail
