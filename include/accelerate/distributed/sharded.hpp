// The engine of the sharded Backend policies Zero<Transport, 1|2>: the process group, rendezvous
// and collectives of ProcessGroupEngine, with sharded gradient reducers and the engine hooks
// (distributed/engine.hpp) where sharding differs from data parallel: the optimizer is
// narrowed to this rank's shard when prepared, its step all-gathers the updated parameters,
// clipping reduces the norm's parts across ranks, fp16 ranks agree on skipping, and each rank
// checkpoints its own optimizer shard with a manifest of what it holds.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <accelerate/checkpoint/optimizer_state.hpp>
#include <accelerate/checkpoint/registry.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/distributed/engine.hpp>
#include <accelerate/distributed/process_group.hpp>
#include <accelerate/distributed/reducer.hpp>
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

/// ZeRO stage `Stage` (1: optimizer state, 2: and gradients) over `Factory`'s process group.
/// Models are prepared as with data parallel (same check, broadcast and buckets) but their
/// reducer is sharded (Sharding::optimizer_state or Sharding::gradients): rank r owns the r-th
/// slice of every gradient bucket. A prepared optimizer's param groups are narrowed to those
/// slices (adopt_optimizer), so its state holds 1/world_size of the parameters.
/// Example:
///   accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 1>> acc;   // this engine inside
template <class Factory, int Stage>
class ShardedEngine : public ProcessGroupEngine<Factory> {
  using Base = ProcessGroupEngine<Factory>;
  static_assert(Stage == 1 || Stage == 2, "ShardedEngine: stage 1 or 2");

 public:
  static constexpr int stage = Stage;
  using ModelSync = ReducerHandle;
  using Base::Base;

  /// As data parallel, with a sharded reducer this engine keeps, so that optimizers prepared
  /// afterwards find which slices of their parameters this rank owns.
  ReducerHandle make_model_sync(torch::nn::Module& module, const std::string& name,
                                const AcceleratorOptions& options) {
    ReducerHandle handle = Base::make_model_sync(module, name, options,
                                                 Stage == 1 ? Sharding::optimizer_state : Sharding::gradients);
    if (!handle.shared_reducer()) {  // one process: each parameter is its own whole shard
      for (auto& item : module.named_parameters(true))
        if (item.value().requires_grad()) whole_[item.value().unsafeGetTensorImpl()] = {name, item.key()};
    }
    if (const auto& reducer = handle.shared_reducer()) {
      models_.push_back({name, reducer});
      const auto& params = reducer->parameters();
      for (std::size_t i = 0; i < params.size(); ++i)
        owners_[params[i].unsafeGetTensorImpl()] = {models_.size() - 1, i};
      const auto& pieces = reducer->shard_piece_tensors();
      for (std::size_t k = 0; k < pieces.size(); ++k) {
        piece_of_[params[reducer->shard_pieces()[k].param].unsafeGetTensorImpl()] = {models_.size() - 1, k};
        slices_.insert(pieces[k].unsafeGetTensorImpl());
      }
    }
    return handle;
  }

  /// free_memory(): forgets every prepared model and optimizer. Their prepared objects must not
  /// be used afterwards (the shards they step are no longer known here).
  void release_prepared() {
    models_.clear();
    owners_.clear();
    piece_of_.clear();
    whole_.clear();
    slices_.clear();
    shards_.clear();
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
            shard.pieces.push_back({models_[model].name, reducer.names()[index],
                                    std::vector<int64_t>(param.sizes().begin(), param.sizes().end()),
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
  /// parameters, so each rank's model is whole and the same again.
  void step_optimizer(torch::optim::Optimizer& optimizer) {
    optimizer.step();
    const auto shard = shards_.find(&optimizer);
    if (shard == shards_.end()) return;
    for (const auto& [model, bucket] : shard->second.buckets) models_[model].reducer->gather_parameters(bucket);
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
    const double coefficient = max_norm / (total + 1e-6);
    if (coefficient < 1.0) {
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
      std::map<std::string, at::Tensor> assembled;  // state name -> this slice's elements
      int64_t covered = 0;
      for (const Source* source : overlapping) {
        const int64_t from = std::max(begin, source->offset), to = std::min(begin + numel, source->offset + source->numel);
        covered += to - from;
        const std::string prefix = "state." + source->index + ".";
        for (const auto& [name, tensor] : source->state->tensors) {
          if (!name.starts_with(prefix)) continue;
          const std::string field = name.substr(prefix.size());
          ACCELERATE_CHECK(tensor.numel() == source->numel, "sharded optimizer state: ", name, " has ",
                           tensor.numel(), " elements, its slice of ", model, ".", parameter, " ", source->numel);
          auto& target = assembled[field];
          if (!target.defined()) target = at::zeros({numel}, tensor.options());
          target.narrow(0, from - begin, to - from).copy_(tensor.reshape(-1).narrow(0, from - source->offset, to - from));
        }
      }
      ACCELERATE_CHECK(covered == numel, "sharded optimizer state: the saved slices cover ", covered, " of the ",
                       numel, " elements [", begin, ", ", begin + numel, ") of ", model, ".", parameter);
      for (auto& [field, tensor] : assembled)
        out.tensors["state." + key + "." + field] = tensor.reshape(params[static_cast<std::size_t>(my_index)].sizes());
    }
    out.values["state"] = states;
    return out;
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
  // Model parameter -> (model, index in its reducer), and -> (model, index of this rank's slice).
  std::map<const c10::TensorImpl*, std::pair<std::size_t, std::size_t>> owners_;
  std::map<const c10::TensorImpl*, std::pair<std::size_t, std::size_t>> piece_of_;
  // One process: model parameter -> (model, parameter name), each its own whole shard.
  std::map<const c10::TensorImpl*, std::pair<std::string, std::string>> whole_;
  std::set<const c10::TensorImpl*> slices_;  // every slice tensor (clip_grad_norm_ looks them up each step)
  std::map<const torch::optim::Optimizer*, OptimizerShard> shards_;
};

}  // namespace accelerate::distributed

namespace accelerate::detail {

template <int Stage>
struct backend_engine<Zero<Gloo, Stage>> {
  using type = distributed::ShardedEngine<distributed::GlooFactory, Stage>;
  static_assert(distributed::BackendEngine<type>);
};

}  // namespace accelerate::detail
