// Bodies of sharded.hpp's ShardedCore (see detail/linkage.hpp): compiled once for every
// transport and stage in the separately compiled mode.
#pragma once

#if defined(__GLIBC__) || __has_include(<malloc.h>)
#include <malloc.h>  // malloc_trim
#endif

#include <accelerate/distributed/sharded.hpp>

namespace accelerate::distributed {

ACCELERATE_INLINE ShardedCore::ShardedCore(const AcceleratorOptions& options, std::string_view fingerprint,
                                           ProcessGroupTransport transport, int stage)
    : ProcessGroupCore(options, fingerprint, transport),
      stage_(stage),
      trims_heap_each_step_(!options.retain_freed_memory.value_or(false)) {
  ACCELERATE_CHECK(stage >= 1 && stage <= 3, "ShardedCore: stage 1, 2 or 3, not ", stage);
}

ACCELERATE_INLINE std::string ShardedCore::name() const { return "Zero stage " + std::to_string(stage_); }

template <class State>
std::unique_ptr<torch::optim::OptimizerParamState> ShardedCore::sliced_state(
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

ACCELERATE_INLINE ReducerHandle ShardedCore::make_sharded_model_sync(torch::nn::Module& module, const std::string& name,
                                                                     const AcceleratorOptions& options) {
  const Sharding sharding =
      stage_ == 1 ? Sharding::optimizer_state : stage_ == 2 ? Sharding::gradients : Sharding::parameters;
  // Stage 3's units: those listed, else a Sequential's children, else the whole model.
  const std::vector<std::string>& listed = stage_ == 3 ? options.ddp.shard_units : std::vector<std::string>{};
  std::vector<std::string> units = listed;
  const auto unit_modules = listed_units(module, listed);
  if (stage_ == 3 && listed.empty() && dynamic_cast<torch::nn::SequentialImpl*>(&module) != nullptr)
    for (const auto& child : module.named_children()) units.push_back(child.key());
  std::unordered_map<const c10::TensorImpl*, BuiltSlice> built;  // its parameters cut as built
  for (auto& p : module.parameters(true)) {
    const auto it = built_.find(p.unsafeGetTensorImpl());
    if (it == built_.end()) continue;
    built.insert(std::move(*it));
    built_.erase(it);
  }
  std::shared_ptr<ParameterUnits> store;
  if (stage_ == 3 && this->communicator())
    store = std::make_shared<ParameterUnits>(std::move(units), std::move(built), options.ddp.prefetch_units);
  ReducerHandle handle = ProcessGroupCore::make_model_sync(module, name, options, sharding, store);
  if (!handle.shared_reducer()) {  // one process: each parameter is its own whole shard
    for (auto& item : module.named_parameters(true))
      if (item.value().requires_grad()) whole_[item.value().unsafeGetTensorImpl()] = {name, item.key()};
  }
  if (const auto& reducer = handle.shared_reducer()) {
    models_.push_back({name, reducer, store});
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
  if (!listed.empty() && store) {  // (stage 3 only lists units)
    for (std::size_t u = 0; u < listed.size(); ++u)
      UnitBindings::instance().bind(unit_modules[u],
                                    {store, u, u + 1 < listed.size() ? std::optional(u + 1) : std::nullopt,
                                     u > 0 ? std::optional(u - 1) : std::nullopt});
  }
  return handle;
}

ACCELERATE_INLINE std::shared_ptr<ParameterUnits> ShardedCore::parameter_units(const torch::nn::Module& module) const {
  const auto found = model_of_.find(&module);
  return found == model_of_.end() ? nullptr : models_[found->second].units;
}

ACCELERATE_INLINE void ShardedCore::cut_as_built(torch::nn::Module& unit) {
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

ACCELERATE_INLINE void ShardedCore::return_free_heap_to_os() {
  #if defined(__GLIBC__)
      ::malloc_trim(0);
  #endif
}

ACCELERATE_INLINE std::vector<const torch::nn::Module*> ShardedCore::listed_units(const torch::nn::Module& module,
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

ACCELERATE_INLINE void ShardedCore::release_prepared() {
  for (const auto& entry : models_)
    if (entry.units) UnitBindings::instance().unbind(entry.units.get());
  models_.clear();
  model_of_.clear();
  owners_.clear();
  piece_of_.clear();
  whole_.clear();
  slices_.clear();
  shards_.clear();
  built_.clear();
}

ACCELERATE_INLINE void ShardedCore::adopt_optimizer(torch::optim::Optimizer& optimizer) {
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

ACCELERATE_INLINE void ShardedCore::step_optimizer(torch::optim::Optimizer& optimizer) {
  optimizer.step();
  const auto shard = shards_.find(&optimizer);
  if (shard == shards_.end()) return;
  for (const auto& [model, bucket] : shard->second.buckets) {
    if (models_[model].units) models_[model].units->release_units();
    else models_[model].reducer->gather_parameters(bucket);
  }
  if (trims_heap_each_step_ && this->collective_device().is_cpu()) return_free_heap_to_os();
}

ACCELERATE_INLINE void ShardedCore::zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) {
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

ACCELERATE_INLINE std::vector<std::pair<std::string, at::Tensor>> ShardedCore::gathered_model_state(const torch::nn::Module& module) {
  auto state = checkpoint::named_tensors(module);
  const auto found = model_of_.find(&module);
  if (found == model_of_.end()) return state;  // one process: the parameters are whole
  const GradientReducer& reducer = *models_[found->second].reducer;
  ParameterUnits& units = *models_[found->second].units;
  std::map<std::string, at::Tensor> whole;
  for (std::size_t u = 0; u < units.unit_count(); ++u) {
    if (!units.unit_has_parameters(u)) continue;
    const bool was_gathered = units.unit_gathered(u);
    units.gather_unit(u);
    for (const std::size_t index : units.unit_parameters(u))
      whole[reducer.names()[index]] = reducer.parameters()[index].detach().clone();
    if (!was_gathered) units.release_unit(u);
  }
  for (auto& [name, tensor] : state)
    if (const auto it = whole.find(name); it != whole.end()) tensor = it->second;
  return state;
}

ACCELERATE_INLINE void ShardedCore::stream_model_files(const torch::nn::Module& module, const std::filesystem::path& dir,
                      const SaveModelOptions& options) {
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

ACCELERATE_INLINE checkpoint::Entry ShardedCore::sharded_model_entry(const torch::nn::Module& module, checkpoint::Entry entry) {
  const auto found = model_of_.find(&module);
  if (found == model_of_.end())
    return this->communicator() ? entry : checkpoint::whole_sharded_model_entry(module, stage_);
  std::shared_ptr<GradientReducer> reducer = models_[found->second].reducer;
  std::shared_ptr<ParameterUnits> units = models_[found->second].units;
  std::vector<checkpoint::ShardRecord> pieces;
  for (const auto& piece : reducer->shard_pieces())
    pieces.push_back({.parameter = reducer->names()[piece.param], .shape = reducer->shape_of(piece.param),
                      .offset = piece.begin, .numel = piece.length});
  const nlohmann::json manifest = checkpoint::shard_manifest(stage_, this->world_size(), this->rank(), pieces);
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
  entry.load = [reducer, units, target, check, sharded](const StateDict& saved) {
    check(saved);
    torch::NoGradGuard no_grad;
    for (auto& [name, tensor] : checkpoint::named_tensors(*target))
      if (!sharded->count(name)) tensor.copy_(saved.tensors.at(name));
    for (std::size_t k = 0; k < reducer->shard_pieces().size(); ++k) {
      at::Tensor piece = reducer->shard_piece_tensors()[k];
      piece.copy_(saved.tensors.at(reducer->names()[reducer->shard_pieces()[k].param]).reshape(-1));
    }
    units->release_units();  // a unit left gathered holds the old values
  };
  entry.reshard = [manifest](const std::vector<StateDict>& saved) {
    return checkpoint::resharded_model_state(manifest, saved);
  };
  entry.laid_out_otherwise = [manifest](const StateDict& saved) { return checkpoint::cut_otherwise(manifest, saved); };
  return entry;
}

ACCELERATE_INLINE std::vector<at::Tensor> ShardedCore::gradient_holders(const std::vector<at::Tensor>& params) const {
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

ACCELERATE_INLINE double ShardedCore::clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm, double norm_type) {
  // One process holds every gradient whole: SingleProcess's clipping, bit for bit.
  if (!this->communicator()) return clip_whole_grad_norm(params, max_norm, norm_type);
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

ACCELERATE_INLINE void ShardedCore::agree_on_found_inf(at::Tensor& found_inf) {
  if (!this->communicator()) return;
  this->all_reduce(found_inf, Reduction::max);
}

ACCELERATE_INLINE checkpoint::Entry ShardedCore::optimizer_entry(const torch::optim::Optimizer& optimizer, checkpoint::Entry entry) {
  const auto shard = shards_.find(&optimizer);
  if (shard == shards_.end()) return entry;
  const nlohmann::json manifest =
      checkpoint::shard_manifest(stage_, this->world_size(), this->rank(), shard->second.pieces);
  auto verify = [manifest](const StateDict& saved) { checkpoint::check_optimizer_manifest(manifest, saved); };
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
    return checkpoint::resharded_optimizer_state(manifest, optimizer, saved);
  };
  entry.laid_out_otherwise = [manifest](const StateDict& saved) { return checkpoint::cut_otherwise(manifest, saved); };
  return entry;
}

}  // namespace accelerate::distributed
