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
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include <accelerate/checkpoint/module_state.hpp>
#include <accelerate/checkpoint/optimizer_state.hpp>
#include <accelerate/checkpoint/registry.hpp>
#include <accelerate/checkpoint/shard_manifest.hpp>
#include <accelerate/checkpoint/sharding.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>
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
  /// `units`: the model's parameter store (null with one process, where nothing is sharded);
  /// `listed`: DdpOptions::shard_units, the units unit_forward gathers (the rest is gathered here).
  ShardedModelSync(ReducerHandle handle, std::shared_ptr<ParameterUnits> units, std::vector<std::string> listed)
      : ReducerHandle(std::move(handle)), units_(std::move(units)), listed_(std::move(listed)) {}

  /// Runs `module`'s forward with its units gathered (the prepared model calls it).
  template <class Module, class... Args>
  decltype(auto) forward(Module& module, Args&&... args) {
    if (units_ == nullptr) return module.forward(std::forward<Args>(args)...);
    if (!listed_.empty()) return listed_forward(module, std::forward<Args>(args)...);
    if constexpr (std::is_same_v<Module, torch::nn::SequentialImpl>) {
      if (units_->unit_count() > 1 && !module.is_empty())
        return sequential_forward(module, std::forward<Args>(args)...);
    }
    for (std::size_t u = 0; u < units_->unit_count(); ++u) units_->prefetch_unit(u);  // all in flight,
    for (std::size_t u = 0; u < units_->unit_count(); ++u) units_->gather_unit(u);    // then waited for
    auto output = module.forward(std::forward<Args>(args)...);
    if (!torch::autograd::GradMode::is_enabled()) units_->release_units();  // no backward to come
    return output;
  }

 private:
  // The listed units are gathered by unit_forward; the parameters outside them (the store's
  // last unit) for the whole forward. A listed unit called directly sees its released, empty
  // parameters, and the failing op's error says so.
  template <class Module, class... Args>
  decltype(auto) listed_forward(Module& module, Args&&... args) {
    units_->gather_unit(units_->unit_count() - 1);
    try {
      decltype(auto) output = module.forward(std::forward<Args>(args)...);
      if (!torch::autograd::GradMode::is_enabled()) units_->release_units();  // no backward to come
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
    ParameterUnits& units = *units_;
    const bool backward = torch::autograd::GradMode::is_enabled();
    const std::size_t count = sequential.size();
    std::optional<torch::nn::AnyValue> value;
    std::size_t unit = 0;
    for (auto it = sequential.begin(); it != sequential.end(); ++it, ++unit) {
      units.gather_unit(unit);
      units.prefetch_unit(next_with_parameters(units, unit, +1));
      if (unit == 0) {
        value.emplace(it->any_forward(std::forward<Args>(args)...));
      } else {
        torch::nn::AnyValue next = it->any_forward(std::move(*value));
        value.emplace(std::move(next));
      }
      at::Tensor* output = value->try_get<at::Tensor>();
      if (backward && units.unit_has_parameters(unit) && output != nullptr && output->requires_grad()) {
        units.regather_in_backward(*output, unit, next_with_parameters(units, unit, -1));
      }
      // The last unit's backward comes first: it stays gathered for it.
      if (!backward || unit + 1 < count) units.release_unit(unit);
    }
    return value->get<at::Tensor>();
  }

  // The nearest unit after (+1) or before (-1) `unit` with parameters; unit_count() if none.
  static std::size_t next_with_parameters(const ParameterUnits& units, std::size_t unit, int direction) {
    for (std::size_t u = unit; direction > 0 ? u + 1 < units.unit_count() : u > 0;) {
      u = direction > 0 ? u + 1 : u - 1;
      if (units.unit_has_parameters(u)) return u;
    }
    return units.unit_count();
  }

  std::shared_ptr<ParameterUnits> units_;
  std::vector<std::string> listed_;  // DdpOptions::shard_units
};

/// Everything a ZeRO engine does, for any transport and stage: one class, not a template, so
/// a trainer's translation unit does not generate its code again for the chosen transport and
/// stage (in the separately compiled mode its bodies are compiled once, with the library's).
/// ShardedEngine<Factory, Stage> is its shell: the transport, the stage as a type, and the
/// stage-3 members exposed only at stage 3.
/// Models are prepared as with data parallel (same check, broadcast and buckets) but their
/// reducer is sharded (Sharding::optimizer_state, gradients or parameters): rank r owns the r-th
/// slice of every gradient bucket. A prepared optimizer's param groups are narrowed to those
/// slices (adopt_optimizer), so its state holds 1/world_size of the parameters.
class ShardedCore : public ProcessGroupCore {
 public:
  /// As ProcessGroupCore, sharding at `stage` (1, 2 or 3).
  ShardedCore(const AcceleratorOptions& options, std::string_view fingerprint, ProcessGroupTransport transport,
              int stage);

  /// The ZeRO stage (ShardedEngine::stage as a value).
  int sharding_stage() const noexcept { return stage_; }

  /// Whether each optimizer step ends by handing the heap's free pages back to the OS
  /// (return_free_heap_to_os, CPU only): unless AcceleratorOptions::retain_freed_memory asks to
  /// keep freed memory, which is the point of keeping it — the next step would fault every
  /// trimmed page in again (2 ranks, stage 3, a 0.84M-parameter GPT: about 15 % of a step in
  /// the kernel's page-fault path, perf).
  bool trims_heap_each_step() const noexcept { return trims_heap_each_step_; }

  /// Hands the heap's free pages back to the OS (glibc's malloc_trim; elsewhere nothing).
  /// Sharded engines free and allocate unit and gradient-bucket buffers every step; glibc
  /// serves them from its free lists, which fragment, and keeps the free pieces resident: at
  /// stage 3 with 10M parameters a rank grew from 615 to 825 MB over 80 steps with 163 MB in
  /// use, and stays at about 465 MB between steps trimmed once per step (0.15 ms). On CUDA the
  /// caching allocator keeps its blocks on purpose, and none of this applies.
  static void return_free_heap_to_os();

  /// The modules DdpOptions::shard_units names, checked: each a submodule of `module`, listed
  /// once, none inside another.
  static std::vector<const torch::nn::Module*> listed_units(const torch::nn::Module& module,
                                                            const std::vector<std::string>& listed);

  /// free_memory(): forgets every prepared model and optimizer. Their prepared objects must not
  /// be used afterwards (the shards they step are no longer known here).
  void release_prepared();

  /// Narrows the optimizer's param groups to this rank's slices of its parameters (1-D views
  /// of their storage; a parameter this rank owns nothing of leaves its groups), slicing any
  /// state it already holds (Adagrad's accumulators). Frozen parameters stay as they are.
  void adopt_optimizer(torch::optim::Optimizer& optimizer);

  /// Steps this rank's slices, then all-gathers every bucket holding the optimizer's
  /// parameters, so each rank's model is whole and the same again. Stage 3 gathers nothing:
  /// the next forward does, unit by unit (a unit still gathered is released, being stale).
  void step_optimizer(torch::optim::Optimizer& optimizer);

  /// A prepared optimizer's zero_grad: its slices' gradients, and the local gradients of the
  /// model parameters it was built over (accumulated off the boundary, where no slice holds
  /// them yet), which data parallel's zero_grad clears too.
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none);

  /// This rank's slices of `params`: a model parameter becomes the slice of it this rank
  /// owns (none when it owns nothing of it); slices and frozen parameters stay as they are.
  std::vector<at::Tensor> gradient_holders(const std::vector<at::Tensor>& params) const;

  /// The global `norm_type`-norm of the gradients of `params` (model parameters or the
  /// optimizer's slices): each rank adds up its slices' part, one all-reduce combines them
  /// (sum of p-th powers, or max), and every rank scales its slices by the same factor.
  double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm, double norm_type);

  /// Every rank skips an fp16 step when any rank's slices held an inf or NaN.
  void agree_on_found_inf(at::Tensor& found_inf);

  /// A prepared optimizer's checkpoint entry: each rank writes its own shard
  /// (optimizer_<i>_rank<r>), whose JSON carries a manifest under "shards": the stage, the
  /// world size, this rank, and for each slice the model, parameter name, global shape, the
  /// flat range [offset, offset + numel) it holds and its index in the optimizer's state.
  /// Loading checks the manifest first; a checkpoint of another world size (or stage) is
  /// re-cut from every saved rank's slices (checkpoint::resharded_optimizer_state).
  checkpoint::Entry optimizer_entry(const torch::optim::Optimizer& optimizer, checkpoint::Entry entry);

 protected:
  /// As data parallel, with a sharded reducer this engine keeps, so that optimizers prepared
  /// afterwards find which slices of their parameters this rank owns.
  ReducerHandle make_sharded_model_sync(torch::nn::Module& module, const std::string& name,
                                        const AcceleratorOptions& options);

  /// Stage 3: the store of a prepared model's parameters (null with one process).
  std::shared_ptr<ParameterUnits> parameter_units(const torch::nn::Module& module) const;

  /// Stage 3: cuts `unit`'s trainable parameters to this rank's slices the moment it is built
  /// (Accelerator::shard_unit): rank 0's values are broadcast, as prepare would, each rank
  /// keeps ceil(numel / W) of each parameter's flattened values, and the parameter becomes an
  /// empty tensor until prepare all-gathers it into its bucket (one parameter at a time). So a
  /// model built unit by unit never exists whole on any rank. A collective: every rank cuts
  /// the same units in the same order. With one process nothing is cut.
  void cut_as_built(torch::nn::Module& unit);

  /// Stage 3: the model's parameters gathered unit by unit (a collective: every rank calls
  /// it), copied out, with its buffers and frozen parameters, in state_dict order.
  std::vector<std::pair<std::string, at::Tensor>> gathered_model_state(const torch::nn::Module& module);

  /// Stage 3: save_model streams the model to rank 0 one output shard at a time. Every rank
  /// plans the same files from the parameters' shapes; for each shard every rank sends rank 0
  /// its slices of the shard's parameters (point to point, straight from the slices it keeps)
  /// and rank 0 receives them into the full tensors, writes the shard and drops them. So rank 0
  /// holds at most one output shard of the gathered model at a time, the others none, and the
  /// model crosses the wire once (an all-gather would move it to every rank). The ranks agree
  /// after each step (a one-element all-reduce): a write failing on rank 0 (disk full, a file
  /// in the way) ends save_model on every rank with an error and leaves the folder as it was.
  void stream_model_files(const torch::nn::Module& module, const std::filesystem::path& dir,
                          const SaveModelOptions& options);

  /// Stage 3: a prepared model's checkpoint entry is each rank's own (model_rank<r>): its
  /// slices of the parameters under their names (1-D), the buffers and frozen parameters
  /// whole, and a manifest under "shards" as the optimizer's (parameter, global shape, flat
  /// range). Loading checks it first; another world size is re-cut from every saved rank.
  checkpoint::Entry sharded_model_entry(const torch::nn::Module& module, checkpoint::Entry entry);

 private:
  // Data parallel's make_model_sync would prepare an unsharded reducer here; models of a
  // sharded engine are prepared by make_sharded_model_sync (ShardedEngine::make_model_sync).
  using ProcessGroupCore::make_model_sync;

  struct Model {
    std::string name;
    std::shared_ptr<GradientReducer> reducer;
    std::shared_ptr<ParameterUnits> units;  // stage 3
  };
  struct OptimizerShard {
    std::vector<checkpoint::ShardRecord> pieces;               // in the optimizer's state order
    std::vector<at::Tensor> model_params;                      // the model parameters it was built over
    std::vector<std::pair<std::size_t, std::size_t>> buckets;  // (model, bucket) to all-gather
  };

  std::string name() const;

  // The state of a whole parameter, cut to the slice `where` (tensors flattened).
  template <class State>
  static std::unique_ptr<torch::optim::OptimizerParamState> sliced_state(
      torch::optim::OptimizerParamState& whole, const ShardPiece& where);

  int stage_;
  bool trims_heap_each_step_;
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

/// ZeRO stage `Stage` (1: optimizer state, 2: and gradients, 3: and parameters) over
/// `Factory`'s process group: ShardedCore with the transport and the stage fixed, its model
/// synchronisation type (stage 3 gathers units in forward), and the members only stage 3 has
/// (the engine hooks find them by name: distributed/engine.hpp).
/// Example:
///   accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 1>> acc;   // this engine inside
template <class Factory, int Stage>
class ShardedEngine : public ShardedCore {
  static_assert(Stage >= 1 && Stage <= 3, "ShardedEngine: stage 1, 2 or 3");

 public:
  static constexpr int stage = Stage;
  using ModelSync = std::conditional_t<Stage == 3, ShardedModelSync, ReducerHandle>;

  ShardedEngine(const AcceleratorOptions& options, std::string_view fingerprint)
      : ShardedCore(options, fingerprint, ProcessGroupTransport{&Factory::device, &Factory::create}, Stage) {}

  /// As data parallel, with a sharded reducer this engine keeps, so that optimizers prepared
  /// afterwards find which slices of their parameters this rank owns.
  ModelSync make_model_sync(torch::nn::Module& module, const std::string& name, const AcceleratorOptions& options) {
    ReducerHandle handle = make_sharded_model_sync(module, name, options);
    if constexpr (Stage == 3) return ModelSync(std::move(handle), parameter_units(module), options.ddp.shard_units);
    else return handle;
  }

  /// Stage 3: see ShardedCore::cut_as_built (Accelerator::shard_unit).
  void shard_as_built(torch::nn::Module& unit)
    requires(Stage == 3)
  {
    cut_as_built(unit);
  }

  /// Stage 3: see ShardedCore::gathered_model_state (get_state_dict).
  std::vector<std::pair<std::string, at::Tensor>> full_model_state(const torch::nn::Module& module)
    requires(Stage == 3)
  {
    return gathered_model_state(module);
  }

  /// Stage 3: see ShardedCore::stream_model_files (save_model).
  void save_model_files(const torch::nn::Module& module, const std::filesystem::path& dir,
                        const SaveModelOptions& options)
    requires(Stage == 3)
  {
    stream_model_files(module, dir, options);
  }

  /// Stage 3: see ShardedCore::sharded_model_entry (save_state/load_state).
  checkpoint::Entry model_entry(const torch::nn::Module& module, checkpoint::Entry entry)
    requires(Stage == 3)
  {
    return sharded_model_entry(module, std::move(entry));
  }
};

}  // namespace accelerate::distributed

namespace accelerate::detail {

template <int Stage>
struct backend_engine<Zero<Gloo, Stage>> {  // Stage 1, 2 or 3
  using type = distributed::ShardedEngine<distributed::GlooFactory, Stage>;
  static_assert(distributed::BackendEngine<type>);
};

}  // namespace accelerate::detail

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/distributed/sharded.ipp>
#endif
