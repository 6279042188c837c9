// Accelerator<Backend, Precision, Accumulation, Clip>: the policy core. It checks the four
// slots (here and only here), prepares a trainer's objects, and forwards to where behaviour
// lives: each slot's step state and the optimizer step's ordering contract (step/), the engine
// and its collectives (distributed/), checkpoints (checkpoint/) and trackers (track/).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/utils/clip_grad.h>

#include <accelerate/checkpoint/module_state.hpp>
#include <accelerate/checkpoint/registry.hpp>
#include <accelerate/checkpoint/safetensors.hpp>
#include <accelerate/checkpoint/sharding.hpp>
#include <accelerate/checkpoint/state.hpp>
#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/compat/torch.hpp>
#include <accelerate/data/batch.hpp>
#include <accelerate/data/loader.hpp>
#include <accelerate/data/shard_sampler.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/diagnostics.hpp>
#include <accelerate/detail/env.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/detail/malloc_tuning.hpp>
#include <accelerate/detail/type_name.hpp>
#include <accelerate/distributed/collectives.hpp>
#include <accelerate/distributed/engine.hpp>
#include <accelerate/distributed/join_state.hpp>
#include <accelerate/distributed/local_engine.hpp>
#include <accelerate/distributed/reduction.hpp>
#include <accelerate/distributed/stats.hpp>
#include <accelerate/gradient_state.hpp>
#include <accelerate/launch/preemption.hpp>
#include <accelerate/memory/batch_size.hpp>
#include <accelerate/options.hpp>
#include <accelerate/policy/accumulation.hpp>
#include <accelerate/policy/backend.hpp>
#include <accelerate/policy/clip.hpp>
#include <accelerate/policy/precision.hpp>
#include <accelerate/policy/slots.hpp>
#include <accelerate/prepared/dataloader.hpp>
#include <accelerate/prepared/model.hpp>
#include <accelerate/prepared/optimizer.hpp>
#include <accelerate/prepared/preparable.hpp>
#include <accelerate/prepared/scheduler.hpp>
#include <accelerate/random.hpp>
#include <accelerate/scope/accumulate.hpp>
#include <accelerate/scope/autocast.hpp>
#include <accelerate/scope/join.hpp>
#include <accelerate/step/context.hpp>
#include <accelerate/track/profile.hpp>
#include <accelerate/track/tracker.hpp>
#include <accelerate/track/trackers.hpp>

namespace accelerate::detail {

/// Accelerator::backward's check_finite_loss: returns when every element of `loss` is finite,
/// else throws naming the value, the backward call (`call`, counted from the Accelerator's
/// creation), the accumulation micro-step if any, and the rank.
void refuse_nonfinite_loss(const at::Tensor& loss, std::uint64_t call, std::optional<std::size_t> micro_step,
                           int rank, int world_size);

/// A seed drawn from torch's default CPU generator, in [0, 2^63) (the range a broadcast
/// int64 tensor carries).
std::uint64_t draw_random_seed();

}  // namespace accelerate::detail

namespace accelerate {

namespace detail {

// A policy of its slot whose step state has its slot's interface. Written as concepts so the
// step state is looked at only once the policy is one (a conjunction of concepts stops at the
// first that fails): instantiating the step state of a rejected type would add errors.
template <class P>
concept precision_with_step = PrecisionPolicy<P> && step::PrecisionStepState<step::PrecisionStep<P>>;
template <class A>
concept accumulation_with_step = AccumulationPolicy<A> && step::AccumulationStepState<step::AccumulationStep<A>>;
template <class C>
concept clip_with_step = ClipPolicy<C> && step::ClipStepState<step::ClipStep<C>, distributed::LocalEngine>;

/// Whether T is what prepare() of accelerator type Acc returned.
template <class T, class Acc> struct prepared_by : std::false_type {};
template <class H, class Acc> struct prepared_by<PreparedModel<H, Acc>, Acc> : std::true_type {};
template <class O, class Acc> struct prepared_by<PreparedOptimizer<O, Acc>, Acc> : std::true_type {};
template <class S, class Acc> struct prepared_by<PreparedScheduler<S, Acc>, Acc> : std::true_type {};
template <class S, class Acc> struct prepared_by<PreparedDataLoader<S, Acc>, Acc> : std::true_type {};

}  // namespace detail

/// The training-loop accelerator, assembled from four policies (see policy/):
///   - Backend: SingleProcess (default), Gloo, Nccl;
///   - Precision: Fp32 (default), Bf16, Fp16;
///   - Accumulation: NoAccumulation (default), Accumulate<N>, AccumulateDynamic;
///   - Clip: NoClip (default), ClipNorm<P>, ClipValue.
/// Run-time knobs are in AcceleratorOptions. A policy that is off adds no member and no code;
/// tests/static/ proves it. An Accelerator neither copies nor moves: prepared objects refer
/// to its shared state (a step::Context, which also holds the optimizer step's ordering).
/// Example:
///   using Acc = accelerate::Accelerator<accelerate::Gloo, accelerate::Bf16, accelerate::Accumulate<4>>;
///   Acc acc{{.seed = 42}};
///   auto [model, opt, loader] = acc.prepare(net, optimizer, accelerate::DataLoader(data, {.batch_size = 32}));
///   for (auto& [x, y] : loader) {
///     auto step = acc.accumulate(model);
///     acc.backward(torch::nll_loss(model(x), y));
///     opt.step();  opt.zero_grad();
///   }
template <class Backend = SingleProcess, class Precision = Fp32, class Accumulation = NoAccumulation,
          class Clip = NoClip>
class Accelerator {
  // One check per slot (and one per policy's step state), here and only here. A rejected type
  // also names itself through detail::rejected_policy<Slot, T>; the body then uses the default
  // in its place, so each mistake produces one error, not a cascade.
  static_assert(BackendPolicy<Backend>,
                "accelerate: the Backend slot (template argument 1) needs a type that satisfies "
                "accelerate::BackendPolicy (SingleProcess, Gloo, Nccl); see <accelerate/policy/backend.hpp>");
  static_assert(detail::accepted<detail::BackendSlot, Backend, BackendPolicy<Backend>>);
  static_assert(PrecisionPolicy<Precision>,
                "accelerate: the Precision slot (template argument 2) needs a type that satisfies "
                "accelerate::PrecisionPolicy (Fp32, Bf16, Fp16); see <accelerate/policy/precision.hpp>");
  static_assert(detail::accepted<detail::PrecisionSlot, Precision, PrecisionPolicy<Precision>>);
  static_assert(AccumulationPolicy<Accumulation>,
                "accelerate: the Accumulation slot (template argument 3) needs a type that satisfies "
                "accelerate::AccumulationPolicy (NoAccumulation, Accumulate<N>, AccumulateDynamic); "
                "see <accelerate/policy/accumulation.hpp>");
  static_assert(detail::accepted<detail::AccumulationSlot, Accumulation,
                                 AccumulationPolicy<Accumulation>>);
  static_assert(ClipPolicy<Clip>,
                "accelerate: the Clip slot (template argument 4) needs a type that satisfies "
                "accelerate::ClipPolicy (NoClip, ClipNorm<P>, ClipValue); see <accelerate/policy/clip.hpp>");
  static_assert(detail::accepted<detail::ClipSlot, Clip, ClipPolicy<Clip>>);
  // And each accepted policy's step state, against its slot's interface (step/*.hpp); a policy
  // the slot refused was named above and is not checked again.
  static constexpr bool precision_step_conforms =
      !PrecisionPolicy<Precision> || detail::precision_with_step<Precision>;
  static constexpr bool accumulation_step_conforms =
      !AccumulationPolicy<Accumulation> || detail::accumulation_with_step<Accumulation>;
  static constexpr bool clip_step_conforms = !ClipPolicy<Clip> || detail::clip_with_step<Clip>;
  static_assert(precision_step_conforms,
                "accelerate: the step state of this Precision policy (step::PrecisionStep<Policy>) does not "
                "satisfy accelerate::step::PrecisionStepState; see <accelerate/step/precision.hpp> for its interface");
  static_assert(detail::accepted<detail::PrecisionStepSlot, Precision, precision_step_conforms>);
  static_assert(accumulation_step_conforms,
                "accelerate: the step state of this Accumulation policy (step::AccumulationStep<Policy>) does "
                "not satisfy accelerate::step::AccumulationStepState; see <accelerate/step/accumulation.hpp> "
                "for its interface");
  static_assert(detail::accepted<detail::AccumulationStepSlot, Accumulation, accumulation_step_conforms>);
  static_assert(clip_step_conforms,
                "accelerate: the step state of this Clip policy (step::ClipStep<Policy>) does not satisfy "
                "accelerate::step::ClipStepState; see <accelerate/step/clip.hpp> for its interface");
  static_assert(detail::accepted<detail::ClipStepSlot, Clip, clip_step_conforms>);

 public:
  using backend_policy = std::conditional_t<BackendPolicy<Backend>, Backend, SingleProcess>;
  using precision_policy = std::conditional_t<detail::precision_with_step<Precision>, Precision, Fp32>;
  using accumulation_policy =
      std::conditional_t<detail::accumulation_with_step<Accumulation>, Accumulation, NoAccumulation>;
  using clip_policy = std::conditional_t<detail::clip_with_step<Clip>, Clip, NoClip>;
  /// The four policies, one per slot (slot_names).
  using policies = type_list<backend_policy, precision_policy, accumulation_policy, clip_policy>;

 private:
  using declared_engine = typename detail::backend_engine<backend_policy>::type;
  static_assert(distributed::BackendEngine<declared_engine>,
                "accelerate: the engine of this Backend policy (detail::backend_engine<B>::type) does not "
                "satisfy accelerate::distributed::BackendEngine: see <accelerate/distributed/engine.hpp> "
                "for what an engine provides, and prove a new one with the conformance suite "
                "(tests/distributed/engine_conformance_test.cpp)");
  static_assert(detail::accepted<detail::BackendEngineSlot, declared_engine,
                                 distributed::BackendEngine<declared_engine>>);

 public:
  using engine_type =
      std::conditional_t<distributed::BackendEngine<declared_engine>, declared_engine, distributed::LocalEngine>;
  using model_sync_type = typename engine_type::ModelSync;
  /// What this accelerator shares with the objects it prepared: the engine, the step state of
  /// each slot and the optimizer step's ordering (see <accelerate/step/context.hpp>).
  using context_type = step::Context<engine_type, accumulation_policy, precision_policy, clip_policy>;

  /// Whether some micro-steps skip gradient synchronisation.
  static constexpr bool accumulating = context_type::accumulation_step::accumulating;
  /// Whether this configuration talks to other processes.
  static constexpr bool distributed = backend_policy::is_distributed;

  /// Builds the accelerator: validates the options, joins the other processes (distributed
  /// backends), picks the device, checks it supports the Precision policy, and seeds the
  /// generators when `options.seed` is set.
  explicit Accelerator(AcceleratorOptions options = {})
      : cpu_memory_(options.retain_freed_memory.value_or(detail::retains_freed_memory_by_default<backend_policy>),
                    options.huge_pages),
        ctx_(validated(options), fingerprint(options)) {
    if constexpr (backend_policy::requires_cuda) {
      ACCELERATE_CHECK(ctx_.core.device.is_cuda(), "Accelerator<", backend_policy::name,
                       ">: needs a CUDA device, but none is visible");
    }
    if (options.seed) set_seed(*options.seed);
  }

  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;
  Accelerator(Accelerator&&) = delete;
  Accelerator& operator=(Accelerator&&) = delete;

  // ---------------------------------------------------------------------------------------
  // Where this process is.

  /// The device models and batches are placed on (cpu, cuda:0, or cuda:LOCAL_RANK).
  const c10::Device& device() const noexcept { return ctx_.core.device; }
  /// Global rank.
  int process_index() const noexcept { return ctx_.engine.rank(); }
  /// Rank on this node.
  int local_process_index() const noexcept { return ctx_.engine.local_rank(); }
  /// World size.
  int num_processes() const noexcept { return ctx_.engine.world_size(); }
  bool is_main_process() const noexcept { return process_index() == 0; }
  bool is_local_main_process() const noexcept { return local_process_index() == 0; }
  bool is_last_process() const noexcept { return process_index() == num_processes() - 1; }
  /// Accelerate's distributed_type: "NO", "MULTI_CPU" or "MULTI_GPU".
  static constexpr std::string_view distributed_type() noexcept {
    return backend_policy::distributed_type;
  }
  /// Accelerate's mixed_precision: "no", "bf16" or "fp16".
  static constexpr std::string_view mixed_precision() noexcept { return precision_policy::name; }
  const AcceleratorOptions& options() const noexcept { return ctx_.core.options; }

  /// Micro-steps per optimizer step.
  std::size_t gradient_accumulation_steps() const noexcept { return ctx_.accumulation.steps(); }

  /// Whether the current micro-step completes an accumulation window (always true, at
  /// compile time, without accumulation).
  constexpr bool sync_gradients() const noexcept { return ctx_.accumulation.sync(); }

  /// The prepared dataloaders being iterated now (Accelerate's GradientState).
  const GradientState& gradient_state() const noexcept { return ctx_.core.gradient_state; }
  /// Whether the innermost prepared dataloader being iterated is at its epoch's last batch
  /// (false outside every loop).
  bool end_of_dataloader() const noexcept { return ctx_.core.gradient_state.end_of_dataloader(); }
  /// Real samples in the innermost active dataloader's last global batch; -1 outside every
  /// loop or for a loader of unknown length (Accelerate's GradientState.remainder).
  std::int64_t remainder() const noexcept { return ctx_.core.gradient_state.remainder(); }

  /// Micro-steps counted by accumulate() since the last forced sync (Accelerate's `step`).
  std::size_t step() const noexcept { return ctx_.accumulation.step(); }

  /// Calls and bytes per collective kind since construction (zero with one process).
  CommStats stats() const { return ctx_.engine.stats(); }

  /// Whether the last step of any prepared optimizer was skipped for an inf/NaN gradient (Fp16),
  /// as Accelerate's optimizer_step_was_skipped; `opt.step_was_skipped()` tells one optimizer.
  bool optimizer_step_was_skipped() const noexcept { return ctx_.precision.step_skipped(); }

  /// The current loss scale (Fp16) or 1.
  double loss_scale() const { return ctx_.precision.loss_scale(); }

  /// The grad scaler (Fp16 only).
  GradScaler& scaler()
    requires context_type::precision_step::scales_loss
  {
    return ctx_.precision.scaler();
  }

  /// The pre-clip global norm measured by the last clipping step (ClipNorm only).
  double last_grad_norm() const
    requires requires(const typename context_type::clip_step& clip) { clip.last_norm(); }
  {
    return ctx_.clip.last_norm();
  }

  /// The engine behind the Backend policy: its process group, communicator and stats, for
  /// tools that measure or extend the transport.
  /// Example: auto* communicator = acc.engine().communicator();  // Gloo
  engine_type& engine() noexcept { return ctx_.engine; }

  /// Prints the arguments, separated by spaces, once per node (on each local main process),
  /// as Accelerate's print does.
  template <class... Args>
  void print(const Args&... args) const {
    if (!is_local_main_process()) return;
    std::ostringstream out;
    bool first = true;
    ((out << (first ? "" : " ") << args, first = false), ...);
    std::cout << out.str() << std::endl;
  }

  /// Blocks until every process reaches this call (a no-op with one process).
  void wait_for_everyone() { ctx_.engine.barrier(); }

  /// Seeds torch's generators; `device_specific` adds the process index.
  void set_seed(std::uint64_t seed, bool device_specific = false) {
    accelerate::set_seed(seed, device_specific, static_cast<std::size_t>(process_index()));
  }

  // ---------------------------------------------------------------------------------------
  // prepare()

  /// Wraps each argument for this accelerator and returns them in a std::tuple, in order:
  ///   - a torch::nn module holder or std::shared_ptr<Module> -> PreparedModel (moved to
  ///     device(); distributed: parameters broadcast from rank 0 and a gradient reducer);
  ///   - a torch::optim optimizer -> PreparedOptimizer;
  ///   - a torch::optim LR scheduler -> PreparedScheduler;
  ///   - an accelerate::DataLoader, a map-style dataset or a range of batches ->
  ///     PreparedDataLoader (this rank's shard, batches on device()).
  /// Lvalue optimizers, schedulers and data are referred to, not copied: keep them alive.
  /// An object this accelerator already prepared comes back unchanged (not wrapped, sharded
  /// or registered twice).
  /// Example:
  ///   auto [model, opt, loader, sched] = acc.prepare(net, optimizer, data, scheduler);
  template <class... Objects>
  auto prepare(Objects&&... objects) {
    // Braced initialisation evaluates left to right, so objects register in argument order.
    return std::tuple<decltype(prepare_one(std::forward<Objects>(objects)))...>{
        prepare_one(std::forward<Objects>(objects))...};
  }

  /// Stage 3 (Zero<_, 3>): cuts a unit of the model to this rank's slices the moment it is
  /// built, so that no rank ever holds the whole model (LibTorch has no meta-device
  /// construction, FSDP's and DeepSpeed zero.Init's way): build the model unit by unit and pass
  /// each, initialised, through shard_unit before building the next. Rank 0's values are kept,
  /// as prepare would broadcast them; the unit's trainable parameters are empty tensors until
  /// prepare gathers them, one at a time, into the slices stage 3 keeps. A collective: every
  /// rank cuts the same units in the same order. With one process the unit is left whole.
  /// Example:
  ///   torch::nn::Sequential net;  // its children are stage 3's units
  ///   for (int i = 0; i < 48; ++i) net->push_back(acc.shard_unit(Block(config)));
  ///   torch::optim::AdamW adamw(net->parameters());
  ///   auto [model, opt] = acc.prepare(net, adamw);
  template <class Unit>
    requires requires(engine_type& engine, torch::nn::Module& unit) { engine.shard_as_built(unit); }
  Unit shard_unit(Unit unit) {
    ctx_.engine.shard_as_built(*unit);
    return unit;
  }

  /// The user's module behind a prepared model (Accelerate's unwrap_model).
  template <class Holder>
  Holder& unwrap_model(PreparedModel<Holder, Accelerator>& model) const noexcept {
    return model.unwrap();
  }

  /// Adds an object to save_state/load_state: anything Stateful (state_dict() /
  /// load_state_dict(const StateDict&)) or a Boost.Hana adapted struct (include
  /// <accelerate/checkpoint/reflect.hpp>). The object is referred to: keep it alive.
  template <class T>
  void register_for_checkpointing(T& object) {
    ctx_.core.checkpoint.add_object(object);
  }

  // ---------------------------------------------------------------------------------------
  // Checkpoints.

  /// Saves the whole training state: prepared models, optimizers, schedulers and dataloader
  /// positions, the grad scaler, every rank's RNGs and micro-step counter, and registered
  /// objects (Accelerate's file names; safetensors and JSON, no pickle). Without `dir`, writes
  /// project_dir/checkpoints/checkpoint_<iteration> and keeps at most total_limit of them. The
  /// folder appears only once complete (staged, fsynced, renamed), so a crash never leaves a
  /// half-written checkpoint or costs the previous one. Every rank must call it. Returns the
  /// folder.
  /// Example:
  ///   acc.save_state();                 // automatic naming (ProjectConfiguration)
  ///   acc.save_state("runs/a/state");   // a folder of your choice
  ///   acc.save_state(std::nullopt, {.asynchronous = true});  // written while training goes on
  std::filesystem::path save_state(const std::optional<std::filesystem::path>& dir = std::nullopt,
                                   const SaveStateOptions& options = {}) {
    auto& background = ctx_.core.background_save;
    if (options.asynchronous) {
      if (!background) background = std::make_unique<checkpoint::BackgroundSave>();
      return checkpoint::save_state_async(state_sources(), ctx_.core.options.project, dir, *background);
    }
    wait_for_save();
    return checkpoint::save_state(state_sources(), ctx_.core.options.project, dir);
  }

  /// Waits until an asynchronous save_state is written and published (every rank: it is
  /// collective) and raises the error its writer met, naming the file. save_state and
  /// load_state call it first; the destructor waits without raising.
  /// Example:
  ///   acc.save_state(std::nullopt, {.asynchronous = true});
  ///   ...
  ///   acc.wait_for_save();   // before reporting the checkpoint as done
  void wait_for_save() {
    if (ctx_.core.background_save) ctx_.core.background_save->finish(state_sources());
  }

  /// Restores what save_state() wrote; without `dir`, the latest complete automatic checkpoint.
  /// All or nothing: the folder, every file's size and checksum, the run's shape (world size,
  /// number of models, optimizers...), the configuration fingerprint (unless
  /// `options.allow_configuration_change`) and every object's content are checked first, and
  /// on any error every object is left as it was; errors name the file. Afterwards each
  /// prepared dataloader resumes at the batch after the last one consumed, and automatic
  /// numbering continues after the loaded checkpoint. Returns the folder loaded.
  /// Example:
  ///   acc.load_state();                         // the latest automatic checkpoint
  ///   acc.load_state("runs/a/state", {.allow_configuration_change = true});
  std::filesystem::path load_state(const std::optional<std::filesystem::path>& dir = std::nullopt,
                                   const LoadStateOptions& options = {}) {
    wait_for_save();
    LoadStateOptions effective = options;
    // Set by an elastic launcher (accelerate::launch --min-nproc): restarts may have fewer ranks.
    if (detail::env_string("ACCELERATE_ALLOW_WORLD_SIZE_CHANGE").value_or("0") == "1")
      effective.allow_world_size_change = true;
    return checkpoint::load_state(state_sources(), ctx_.core.options.project, dir, effective);
  }

  /// Writes a model's parameters and buffers (unwrapped names) as Hugging Face safetensors
  /// into `dir`: model.safetensors, or shards of at most max_shard_size with
  /// model.safetensors.index.json. The main process writes; every rank must call it.
  /// Example:
  ///   acc.save_model(model, "out", {.max_shard_size = "1GB"});
  template <class Model>
  void save_model(const Model& model, const std::filesystem::path& dir, const SaveModelOptions& options = {}) {
    std::exception_ptr failure;  // the main process's write failing ends save_model on every rank
    try {
      distributed::save_model_files(ctx_.engine, module_of(model), dir, options);  // collective when sharded
    } catch (...) {
      failure = std::current_exception();
    }
    const int failed = distributed::first_flagged_rank(ctx_.engine, failure != nullptr);
    if (failure) std::rethrow_exception(failure);
    ACCELERATE_CHECK(failed < 0, "save_model: rank ", failed, " failed writing ", dir.string(),
                     " (its own error names the cause); the folder is as it was");
  }

  /// A model's full parameters and buffers under their unwrapped names (Accelerate's
  /// get_state_dict), whatever the backend: a sharded backend gathers them, so then every rank
  /// must call it. The tensors are the model's own where it holds them whole (no copy).
  /// Example:
  ///   acc.save(acc.get_state_dict(model), "out/weights.safetensors");
  template <class Model>
  std::map<std::string, at::Tensor> get_state_dict(const Model& model) {
    std::map<std::string, at::Tensor> out;
    for (auto& [name, tensor] : distributed::full_model_state(ctx_.engine, module_of(model)))
      out.emplace(name, tensor.detach());
    return out;
  }

  /// Writes `tensors` to `path` as one safetensors file on the main process only, atomically
  /// (a temporary beside it, fsynced, renamed), as Accelerate's `save(obj, f,
  /// safe_serialization=True)`; returns whether this process wrote. No collective: it may be
  /// called on the main process alone.
  /// Example:
  ///   acc.save({{"ema.weight", ema_weight}}, "runs/a/ema.safetensors");
  bool save(const std::map<std::string, at::Tensor>& tensors, const std::filesystem::path& path,
            const std::map<std::string, std::string>& metadata = {{"format", "pt"}}) const {
    if (!is_main_process()) return false;
    checkpoint::save_safetensors(path, tensors, metadata);
    return true;
  }

  /// Registers `hook(dir)`, called on every process by each save_state once the checkpoint's
  /// folder exists and before the state is written (Accelerate's
  /// register_save_state_pre_hook). `dir` is the folder being written, still staged: a file
  /// the hook writes there is published with the rest, atomically, and checksummed in the
  /// manifest. Returns a handle whose remove() unregisters it.
  /// Example:
  ///   auto handle = acc.register_save_state_pre_hook([&](const std::filesystem::path& dir) {
  ///     if (acc.is_main_process()) std::ofstream(dir / "notes.json") << notes.dump();
  ///   });
  checkpoint::StateHooks::Handle register_save_state_pre_hook(checkpoint::StateHooks::Hook hook) {
    return ctx_.core.state_hooks.add_save(std::move(hook));
  }
  /// Registers `hook(dir)`, called on every process by each load_state with the checkpoint's
  /// folder, once its files are verified and before any object is restored (Accelerate's
  /// register_load_state_pre_hook); an error it raises fails load_state with nothing changed.
  /// Returns a handle whose remove() unregisters it.
  /// Example:
  ///   auto handle = acc.register_load_state_pre_hook([&](const std::filesystem::path& dir) {
  ///     notes = nlohmann::json::parse(std::ifstream(dir / "notes.json"));
  ///   });
  checkpoint::StateHooks::Handle register_load_state_pre_hook(checkpoint::StateHooks::Hook hook) {
    return ctx_.core.state_hooks.add_load(std::move(hook));
  }

  /// The project configuration (checkpoint folder, numbering, rotation).
  ProjectConfiguration& project_configuration() noexcept { return ctx_.core.options.project; }

  /// Every object save_state/load_state visit, in order (models, optimizers, ... as prepared).
  const std::vector<detail::CheckpointEntry>& checkpoint_entries() const noexcept {
    return ctx_.core.checkpoint.objects();
  }

  // ---------------------------------------------------------------------------------------
  // The training step.

  /// Backpropagates `loss`: divided by the accumulation window's length (accumulation), scaled
  /// (Fp16), then autograd. Gradients of prepared models are all-reduced from autograd hooks
  /// while backward runs (distributed), and complete when it returns.
  /// With Accelerator<> this is loss.backward() (both step states return the loss itself).
  /// With AcceleratorOptions::check_finite_loss a NaN or infinite loss is an error instead.
  void backward(const at::Tensor& loss) {
    if (ctx_.core.options.check_finite_loss) [[unlikely]]
      refuse_nonfinite_loss(loss);
    if (ctx_.core.items.counted()) [[unlikely]]
      ctx_.core.items.plain_backward();
    ctx_.precision.scale(ctx_.accumulation.divide(loss)).backward();
  }

  /// Backpropagates `loss` weighed as `options` say. With num_items, `loss` is a sum over that
  /// many items (say the summed token losses of a micro-batch, padding excluded): it is not
  /// divided by the window's length; at the window's boundary the gradients become the mean
  /// over all the items of all its micro-steps and processes (one all-reduce of the counts per
  /// window), as if one batch had held them all — what Accelerate's documentation writes by
  /// hand with num_items_in_batch. Between backward and that boundary the gradients are sums.
  /// Every backward of a window then passes num_items (mixing is an error).
  /// Example:
  ///   auto step = acc.accumulate(model);
  ///   at::Tensor mask = labels.ne(pad);
  ///   at::Tensor loss_sum = torch::cross_entropy(logits.flatten(0, 1), labels.flatten(), {}, at::Reduction::None)
  ///                             .masked_select(mask.flatten()).sum();
  ///   acc.backward(loss_sum, {.num_items = mask.sum().item<int64_t>()});
  ///
  /// With one process, no accumulation and no policy acting on the step (the prepared
  /// optimizer's step() is the optimizer's own), each backward is its window: the loss is
  /// divided by num_items at once.
  void backward(const at::Tensor& loss, const BackwardOptions& options) {
    if (!options.num_items) return backward(loss);
    if (ctx_.core.options.check_finite_loss) [[unlikely]]
      refuse_nonfinite_loss(loss);
    if constexpr (context_type::plain_optimizer_step) {
      ACCELERATE_CHECK(*options.num_items > 0, "backward: num_items must be > 0 (the number of items the loss sums "
                       "over; the mean over no item is undefined), got ", *options.num_items);
      ctx_.precision.scale(loss / static_cast<double>(*options.num_items)).backward();
    } else {
      ctx_.core.items.add(*options.num_items);
      ctx_.precision.scale(loss).backward();
    }
  }

  /// Opens one micro-step of gradient accumulation for the given prepared models and decides
  /// whether it is a boundary (sync_gradients()). Off a boundary, the models' gradients are
  /// not communicated and prepared optimizers/schedulers do nothing. The last batch of a
  /// prepared dataloader always syncs (AccumulationOptions::sync_with_dataloader).
  /// Without accumulation the scope is empty and sync_gradients() is constexpr true.
  /// Example:
  ///   for (auto& [x, y] : loader) { auto step = acc.accumulate(model); ... }
  template <class... Models>
  [[nodiscard("keep the scope alive for the micro-step: auto step = acc.accumulate(model);")]]
  auto accumulate(Models&... models) {
    if constexpr (!accumulating) {
      ((void)models, ...);
      return AlwaysSyncScope{};
    } else {
      ctx_.accumulation.advance(ctx_.core.gradient_state, ctx_.core.options.accumulation.sync_with_dataloader);
      const bool sync = ctx_.accumulation.sync();
      if constexpr (distributed) {
        return AccumulateScope<model_sync_type, sizeof...(Models)>(
            sync, sync || ctx_.core.options.accumulation.sync_each_batch, {&models.model_sync()...});
      } else {
        ((void)models, ...);
        return AccumulateScope<model_sync_type, 0>(sync, sync, {});
      }
    }
  }

  /// Skips gradient communication of the given models until the scope ends; gradients
  /// accumulate locally (DDP's no_sync). Empty with one process.
  template <class... Models>
  [[nodiscard("keep the scope alive: auto scope = acc.no_sync(model);")]]
  auto no_sync(Models&... models) {
    if constexpr (distributed) {
      return NoSyncScope<model_sync_type, sizeof...(Models)>({&models.model_sync()...});
    } else {
      ((void)models, ...);
      return NoSyncScope<model_sync_type, 0>({});
    }
  }

  /// Training on shards of different lengths (Accelerate's join_uneven_inputs, torch's Join),
  /// for loaders prepared with `.data = {.even_batches = false}`: while the scope lives, each
  /// forward of these models is announced to the ranks that ran out of batches, which match
  /// the collectives of those still training (buffer broadcasts, gradient rounds of zeros) once
  /// their own loop is over; the scope's end is where a rank waits for the others. Gradients
  /// are averaged over the ranks that trained in the step (not the world size: torch's
  /// divide_by_initial_world_size=False). A step synchronises on every training rank when it
  /// does on one (another rank's last batch ends its accumulation window; averaging twice is
  /// the same average). At the end every model's parameters (and broadcast buffers) are
  /// broadcast from the last rank to finish, and so is the state of every prepared optimizer
  /// and scheduler (and the grad scaler and micro-step count): all ranks leave in step, as if
  /// each had trained to the end. Dataloader positions stay each rank's own. Costs one small
  /// all-reduce per forward while the scope lives. Only the prepared models' collectives are shadowed:
  /// other collectives in the loop (gather, reduce, a dispatched loader) would hang, as with
  /// torch's Join. Not available with a sharded Backend. Empty with one process.
  /// Example:
  ///   Acc acc{{.data = {.even_batches = false}}};
  ///   {
  ///     auto join = acc.join_uneven_inputs(model);
  ///     for (auto& [x, y] : loader) { acc.backward(loss(model(x), y)); opt.step(); opt.zero_grad(); }
  ///   }
  template <class... Models>
  [[nodiscard("keep the scope alive around the loop: auto join = acc.join_uneven_inputs(model);")]]
  JoinScope join_uneven_inputs(Models&... models) {
    static_assert(!distributed::customises_step_optimizer<engine_type>,
                  "join_uneven_inputs: a sharded Backend (Zero<...>) steps, clips and checkpoints through "
                  "collectives that a rank which ran out of batches cannot match; use even_batches");
    if constexpr (requires(engine_type& e, std::vector<model_sync_type*> m) { e.join_uneven_inputs(m); }) {
      return ctx_.engine.join_uneven_inputs(std::vector<model_sync_type*>{&models.model_sync()...},
                                            [this](int root) {
                                              distributed::adopt_training_state(ctx_.engine, ctx_.core.checkpoint, root);
                                            });
    } else {
      ((void)models, ...);
      return {};
    }
  }

  /// Autocast for work outside the model (a complex loss); an empty type under Fp32.
  [[nodiscard("keep the scope alive: auto scope = acc.autocast();")]]
  AutocastScope<precision_policy> autocast() const {
    return AutocastScope<precision_policy>(ctx_.core.device.type());
  }

  /// Clips the gradients of `params` to a global `norm_type`-norm of at most `max_norm` and
  /// returns the norm before clipping. Fp16 gradients are unscaled first, only for the
  /// optimizers owning these parameters; a second clip call in the same optimizer step is an
  /// error (as torch.amp.GradScaler's second unscale_). Off an accumulation boundary it does
  /// nothing and returns 0, like the Clip policy, so it may be called every micro-step.
  /// Gradients are already averaged across ranks, so the norm is the same on every rank.
  double clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm,
                         double norm_type = 2.0) {
    if (!sync_gradients()) return 0.0;
    const auto holders = distributed::gradient_holders(ctx_.engine, params);  // a sharded rank's slices
    ctx_.weigh_items(holders);
    ctx_.precision.unscale_owners(holders, "clip_grad_norm_");
    return distributed::clip_grad_norm(ctx_.engine, holders, max_norm, norm_type);
  }

  /// Clamps every gradient element of `params` to [-value, value] (after unscaling, Fp16);
  /// a no-op off an accumulation boundary, as clip_grad_norm_.
  void clip_grad_value_(const std::vector<at::Tensor>& params, double value) {
    if (!sync_gradients()) return;
    const auto holders = distributed::gradient_holders(ctx_.engine, params);  // a sharded rank's slices
    ctx_.weigh_items(holders);
    ctx_.precision.unscale_owners(holders, "clip_grad_value_");
    torch::nn::utils::clip_grad_value_(holders, value);
  }

  /// Divides the gradients of every prepared optimizer by the Fp16 loss scale now, to read or
  /// change the true gradients before opt.step(), which then does not unscale them again
  /// (Accelerate's unscale_gradients). Once per optimizer step, like torch.amp.GradScaler's
  /// unscale_ (a second call is an error); a no-op off an accumulation boundary and without
  /// loss scaling.
  /// Example:
  ///   acc.backward(loss);  acc.unscale_gradients();  log_gradient_norms(net);  opt.step();
  /// Gradients of losses given with num_items are weighed by then too (backward).
  void unscale_gradients() {
    if (!sync_gradients()) return;
    if (ctx_.core.items.counted())
      for (const auto& weak : ctx_.core.optimizers)
        if (const auto optimizer = weak.lock()) ctx_.weigh_items(step::optimizer_params(*optimizer));
    ctx_.precision.unscale_all("unscale_gradients");
  }
  /// The same for one prepared optimizer's gradients.
  template <class Optimizer>
  void unscale_gradients(PreparedOptimizer<Optimizer, Accelerator>& optimizer) {
    if (!sync_gradients()) return;
    const auto params = step::optimizer_params(optimizer.unwrap());
    ctx_.weigh_items(params);
    ctx_.precision.unscale_owners(params, "unscale_gradients");
  }

  // ---------------------------------------------------------------------------------------
  // Collectives on tensors and nested containers (vectors, arrays, tuples, maps, Examples)
  // whose leaves are all tensors; a number or string leaf is a compile-time error (it could
  // only come back as this rank's own value). Other values travel as JSON through
  // gather_object/broadcast_object. With one process each returns its input. Each forwards to
  // the free function of the same name in <accelerate/distributed/collectives.hpp>.

  /// Concatenates every process's tensors along dimension 0, in rank order. Sizes along
  /// dimension 0 may differ between processes.
  /// Example: at::Tensor all_logits = acc.gather(logits);
  template <class T>
  T gather(const T& data) {
    return distributed::gather(ctx_.engine, data);
  }

  /// Every process's `value`, in rank order, for any value nlohmann::json can serialise
  /// (numbers, strings, vectors, maps, your types with to_json/from_json).
  /// Example:
  ///   std::vector<std::string> names = acc.gather_object(std::string("rank ") + std::to_string(r));
  template <class T>
    requires(!data::tensors_only_v<T>)
  std::vector<T> gather_object(const T& value) {
    return distributed::gather_object(ctx_.engine, value);
  }

  /// Process `from`'s `value` on every process, for any value nlohmann::json can serialise.
  /// Example: auto vocabulary = acc.broadcast_object(local_vocabulary);
  template <class T>
    requires(!data::tensors_only_v<T>)
  T broadcast_object(const T& value, int from = 0) {
    return distributed::broadcast_object(ctx_.engine, value, from);
  }

  /// gather(), and on the last batch of a prepared dataloader being iterated drop the samples
  /// that even batching duplicated, so a whole evaluation gathers exactly the dataset's length.
  /// Outside a prepared loop (results concatenated after it) nothing is dropped. A value that
  /// is not made of tensors (or `use_gather_object`) goes through gather_object: a vector's
  /// elements are concatenated in rank order and the duplicates dropped as for tensors;
  /// any other value comes back as the vector of every rank's value.
  /// Example:
  ///   auto predictions = acc.gather_for_metrics(logits.argmax(1));
  ///   std::vector<std::string> labels = acc.gather_for_metrics(batch_labels);  // strings: objects
  template <class T>
  auto gather_for_metrics(const T& data, const GatherForMetricsOptions& options = {}) {
    return distributed::gather_for_metrics(ctx_.engine, ctx_.core.gradient_state, data, options);
  }

  /// Combines every process's tensors element-wise (sum, mean, max, min).
  /// Example: at::Tensor correct = acc.reduce(local_correct, accelerate::Reduction::sum);
  template <class T>
  T reduce(const T& data, Reduction reduction = Reduction::sum) {
    return distributed::reduce(ctx_.engine, data, reduction);
  }

  /// Every process receives process `from`'s tensors (shapes and dtypes follow the sender).
  /// Example: at::Tensor weights = acc.broadcast(local_weights, 0);
  template <class T>
  T broadcast(const T& data, int from = 0) {
    return distributed::broadcast(ctx_.engine, data, from);
  }

  /// Pads each tensor along `dim` with `pad_value` to the largest size across processes
  /// (before the data when `pad_first`), so they can be gathered.
  /// Example: auto tokens = acc.pad_across_processes(local_tokens, 1, pad_id);
  template <class T>
  T pad_across_processes(const T& data, int64_t dim = 0, double pad_value = 0, bool pad_first = false) {
    return distributed::pad_across_processes(ctx_.engine, data, dim, pad_value, pad_first);
  }

  /// This process's contiguous share of `inputs` (a vector or a tensor's rows): the first
  /// len % world processes get one extra item; with `apply_padding` every process gets
  /// ceil(len / world) items, the last item repeated.
  /// Example: auto my_prompts = acc.split_between_processes(prompts);
  template <class T>
  T split_between_processes(const T& inputs, bool apply_padding = false) const {
    return distributed::split_between_processes(ctx_.engine, inputs, apply_padding);
  }

  // ---------------------------------------------------------------------------------------
  // Experiment tracking (main process only; the other ranks' calls do nothing).

  /// Adds a tracker of your own (any type modelling accelerate::Tracker) to those
  /// init_trackers() starts.
  template <Tracker T>
  void add_tracker(T tracker) {
    if (is_main_process()) ctx_.core.trackers.add(std::move(tracker));
  }

  /// Starts the trackers of TrackingOptions::log_with (under logging_dir/project_name) and
  /// those added, recording `config` (hyperparameters).
  /// Example:
  ///   acc.init_trackers("fashion_mnist", {{"lr", 1e-3}, {"batch_size", 64}});
  void init_trackers(const std::string& project_name, const nlohmann::json& config = nlohmann::json::object()) {
    if (is_main_process())
      ctx_.core.trackers.start(project_name, config, ctx_.core.options.tracking, ctx_.core.options.project.project_dir);
  }

  /// Records scalar metrics at `step` with every tracker.
  /// Example: acc.log({{"loss", loss.item<double>()}, {"lr", lr}}, step);
  void log(const Metrics& values, std::int64_t step) {
    ctx_.core.trackers.log(values, step);
  }

  /// Finishes the trackers and waits for every rank (Accelerate's end_training).
  void end_training() {
    ctx_.core.trackers.finish();
    wait_for_everyone();
  }

  /// Raises this process's trigger (Accelerate's set_trigger): check_trigger() then returns
  /// true on every rank.
  void set_trigger() noexcept { ctx_.core.trigger = true; }

  /// Whether any rank raised its trigger (set_trigger) or received a preemption signal
  /// under a PreemptionGuard since the last check; the answer is the same on every rank
  /// (one small all-reduce when distributed) and resets the flags. Every rank must call it.
  bool check_trigger() {
    const bool local = ctx_.core.trigger || preemption_requested();
    ctx_.core.trigger = false;
    clear_preemption_request();
    return distributed::any_process(ctx_.engine, local);
  }

  /// Runs `fn` on the main process only; returns whether it ran.
  template <class Fn>
  bool on_main_process(Fn&& fn) {
    if (!is_main_process()) return false;
    std::forward<Fn>(fn)();
    return true;
  }
  /// Runs `fn` on each node's local main process only; returns whether it ran.
  template <class Fn>
  bool on_local_main_process(Fn&& fn) {
    if (!is_local_main_process()) return false;
    std::forward<Fn>(fn)();
    return true;
  }
  /// Runs `fn` on process `index` only; returns whether it ran.
  template <class Fn>
  bool on_process(int index, Fn&& fn) {
    if (process_index() != index) return false;
    std::forward<Fn>(fn)();
    return true;
  }
  /// Runs `fn` on the last process only; returns whether it ran.
  template <class Fn>
  bool on_last_process(Fn&& fn) {
    return on_process(num_processes() - 1, std::forward<Fn>(fn));
  }
  /// Runs `fn` on local process `local_index` of every node only; returns whether it ran.
  /// Example:
  ///   acc.on_local_process(1, [] { warm_the_node_cache(); });
  template <class Fn>
  bool on_local_process(int local_index, Fn&& fn) {
    if (local_process_index() != local_index) return false;
    std::forward<Fn>(fn)();
    return true;
  }

  /// Scope in which some processes run first and the others wait for them (downloads,
  /// preprocessing): the others block at entry, the first ones at exit (both through
  /// wait_for_everyone, so every process must open and close it).
  class [[nodiscard]] MainProcessFirst {
   public:
    MainProcessFirst(Accelerator& acc, bool goes_first) : acc_(acc), goes_first_(goes_first) {
      if (!goes_first_) acc_.wait_for_everyone();
    }
    explicit MainProcessFirst(Accelerator& acc) : MainProcessFirst(acc, acc.is_main_process()) {}
    ~MainProcessFirst() {
      if (goes_first_) acc_.wait_for_everyone();
    }
    MainProcessFirst(const MainProcessFirst&) = delete;
    MainProcessFirst& operator=(const MainProcessFirst&) = delete;

   private:
    Accelerator& acc_;
    bool goes_first_;
  };
  /// The main process first, then the others.
  /// Example: { auto first = acc.main_process_first(); prepare_cache(); }
  [[nodiscard("keep the scope alive: auto first = acc.main_process_first();")]]
  MainProcessFirst main_process_first() { return MainProcessFirst(*this, is_main_process()); }
  /// Each node's local main process first, then the others (a per-node cache).
  /// Example: { auto first = acc.local_main_process_first(); fill_node_cache(); }
  [[nodiscard("keep the scope alive: auto first = acc.local_main_process_first();")]]
  MainProcessFirst local_main_process_first() { return MainProcessFirst(*this, is_local_main_process()); }

  // ---------------------------------------------------------------------------------------
  // Memory and profiling

  /// Forgets every prepared model, optimizer, scheduler and dataloader (save_state no longer
  /// visits them; objects registered with register_for_checkpointing stay), resets the
  /// micro-step counter and empties the accelerator's device cache — Accelerate's free_memory,
  /// called between two trainings with different models. Memory comes back once the caller
  /// drops its own prepared objects too; those must not be used afterwards: prepare new ones.
  /// Example:
  ///   acc.free_memory();   // then: auto [model, opt] = acc.prepare(bigger_net, new_optimizer);
  void free_memory() {
    ctx_.core.checkpoint.release_prepared();
    ctx_.core.optimizers.clear();
    ctx_.core.items = {};
    ctx_.precision.release_optimizers();
    distributed::release_prepared(ctx_.engine);
    if constexpr (requires { ctx_.accumulation.reset(); }) ctx_.accumulation.reset();
    compat::empty_device_cache();
  }
  /// The same as free_memory() (Accelerate's alias).
  void clear() { free_memory(); }

  /// Calls `train(batch_size)`, halving the size while it runs out of memory, every process
  /// agreeing on the size; returns what `train` returns (memory::find_executable_batch_size has
  /// the details and the conditions for several processes).
  /// Example:
  ///   acc.find_executable_batch_size([&](std::int64_t batch_size) { train_with(batch_size); }, 256);
  template <class Train>
  decltype(auto) find_executable_batch_size(Train&& train, std::int64_t starting_batch_size) {
    return memory::find_executable_batch_size(ctx_.engine, std::forward<Train>(train), starting_batch_size);
  }

  /// LibTorch's profiler around a block: keep the returned scope alive while the block runs;
  /// when it ends each rank writes `options.output_trace_dir`/profile_<rank>.json (a Chrome
  /// trace) and prints the path (ProfileScope).
  /// Example:
  ///   { auto profiling = acc.profile({.output_trace_dir = "traces"}); for (...) train_step(); }
  [[nodiscard("keep the scope alive: auto profiling = acc.profile({...});")]]
  ProfileScope profile(const ProfileOptions& options = {}) {
    return ProfileScope(options, process_index(), ctx_.core.device);
  }

 private:
  /// A description of the compile-time configuration and the options every rank must share,
  /// compared across ranks at start-up.
  static std::string fingerprint(const AcceleratorOptions& o) {
    return detail::fingerprint(detail::describe_slots(policies{}), o);
  }

  template <class Model>
  static const torch::nn::Module& module_of(const Model& model) {
    if constexpr (requires { model.unwrap(); }) return *detail::impl_pointer(model.unwrap());
    else if constexpr (ModuleLike<Model>) return *detail::impl_pointer(model);
    else return model;
  }

  template <class T>
  static constexpr bool is_prepared_here = detail::prepared_by<T, Accelerator>::value;

  checkpoint::StateSources state_sources() {
    return {&ctx_.core.checkpoint,
            process_index(),
            num_processes(),
            distributed::writes_replicated_state(ctx_.engine),
            fingerprint(ctx_.core.options),
            [this] { wait_for_everyone(); },
            ctx_.core.options.process_group.timeout,
            [this](const std::filesystem::path& dir) { ctx_.core.state_hooks.run_save(dir); },
            [this](const std::filesystem::path& dir) { ctx_.core.state_hooks.run_load(dir); },
            [this](bool failed) { return distributed::first_flagged_rank(ctx_.engine, failed); }};
  }

  static const AcceleratorOptions& validated(const AcceleratorOptions& options) {
    detail::validate(options);
    return options;
  }

  template <class T>
  auto prepare_one(T&& object) {
    if constexpr (is_prepared_here<std::remove_cvref_t<T>>) {
      return std::remove_cvref_t<T>(object);  // already prepared: unchanged, not wrapped twice
    } else if constexpr (ModuleLike<T>) {
      return prepare_model(std::forward<T>(object));
    } else if constexpr (OptimizerLike<T>) {
      return prepare_optimizer(std::forward<T>(object));
    } else if constexpr (SchedulerLike<T>) {
      return prepare_scheduler(std::forward<T>(object));
    } else if constexpr (DataSource<T>) {
      return prepare_data(std::forward<T>(object));
    } else {
      static_assert(detail::dependent_false<T>,
                    "accelerate::Accelerator::prepare: this argument is not a torch::nn module, a "
                    "torch::optim optimizer or LR scheduler, an accelerate::DataLoader, a map-style "
                    "dataset or a range of batches (its type is named by unpreparable_type<...> below)");
      return detail::unpreparable_type<std::remove_cvref_t<T>>{};
    }
  }

  template <class M>
  auto prepare_model(M&& module) {
    using Holder = std::remove_cvref_t<M>;
    Holder holder = module;
    holder->to(ctx_.core.device);
    const std::string name = "model_" + std::to_string(count(detail::CheckpointEntry::Kind::model));
    auto sync = ctx_.engine.make_model_sync(*holder, name, ctx_.core.options);
    std::shared_ptr<torch::nn::Module> shared = detail::module_pointer(holder);
    ctx_.core.checkpoint.add(  // a sharded engine makes each rank write its own slices
        distributed::model_entry(ctx_.engine, *shared, checkpoint::Registry::model_entry(shared)));
    if constexpr (requires { sync.checkpoint_entry(name); })
      if (auto entry = sync.checkpoint_entry(name)) ctx_.core.checkpoint.add(std::move(*entry));
    return PreparedModel<Holder, Accelerator>(std::move(holder), &ctx_, std::move(sync));
  }

  template <class O>
  auto prepare_optimizer(O&& optimizer) {
    auto held = detail::hold(std::forward<O>(optimizer));
    using Optimizer = typename decltype(held)::element_type;
    distributed::adopt_optimizer(ctx_.engine, *held);  // a sharded engine keeps this rank's shard
    PreparedOptimizer<Optimizer, Accelerator> prepared(held, &ctx_, ctx_.precision.add_optimizer(*held));
    ctx_.core.optimizers.push_back(held);
    // Built-in optimizers are checked in full before load_state changes anything, so they
    // need no snapshot (a copy of every moment) to be undone.
    std::function<void(const StateDict&)> check;
    if constexpr (!Stateful<Optimizer>)
      check = [held](const StateDict& s) { checkpoint::check_optimizer_state_dict(*held, s); };
    ctx_.core.checkpoint.add(distributed::optimizer_entry(
        ctx_.engine, *held,
        checkpoint::Registry::entry(checkpoint::Entry::Kind::optimizer, checkpoint::EntryOwner::main_rank, prepared,
                                    std::move(check))));
    return prepared;
  }

  template <class S>
  auto prepare_scheduler(S&& scheduler) {
    auto held = detail::hold(std::forward<S>(scheduler));
    using Scheduler = typename decltype(held)::element_type;
    PreparedScheduler<Scheduler, Accelerator> prepared(held, &ctx_);
    ctx_.core.checkpoint.add(checkpoint::Entry::Kind::scheduler, checkpoint::EntryOwner::main_rank, prepared);
    return prepared;
  }

  template <class D>
  auto prepare_data(D&& data) {
    using U = std::remove_cvref_t<D>;
    if constexpr (DataLoaderSpec<U>) {
      using Dataset = typename decltype(data.dataset)::element_type;
      using Source = detail::DatasetSource<Dataset>;
      const data::ShardSpec spec = data::loader_shard_spec(
          data.options, Source::dataset_size(*data.dataset), static_cast<std::size_t>(num_processes()),
          static_cast<std::size_t>(process_index()), ctx_.core.options.data.split_batches,
          ctx_.core.options.data.even_batches, [this] { return shared_random_seed(); });
      const typename Source::Workers workers{data.options.num_workers, data.options.prefetch_factor};
      return register_loader(PreparedDataLoader<Source, Accelerator>(Source(data.dataset, spec, workers), &ctx_));
    } else if constexpr (MapDataset<U>) {
      return prepare_data(DataLoader<U>(detail::hold(std::forward<D>(data))));
    } else {
      auto held = [&] {
        // A const range is only read: it is referred to as const (the caller keeps it alive).
        if constexpr (std::is_lvalue_reference_v<D> && std::is_const_v<std::remove_reference_t<D>>)
          return std::shared_ptr<const U>(std::shared_ptr<void>{}, &data);
        else
          return detail::hold(std::forward<D>(data));
      }();
      using Range = typename decltype(held)::element_type;
      using Source = detail::RangeSource<Range, engine_type>;
      const detail::RangeSharing sharing{.world_size = static_cast<std::size_t>(num_processes()),
                                         .rank = static_cast<std::size_t>(process_index()),
                                         .split = ctx_.core.options.data.split_batches,
                                         .dispatch = ctx_.core.options.data.dispatch_batches};
      return register_loader(PreparedDataLoader<Source, Accelerator>(Source(held, sharing, &ctx_.engine), &ctx_));
    }
  }

  template <class Loader>
  Loader register_loader(Loader loader) {
    if constexpr (distributed) {
      // Ranks whose loaders differ (batch size, length, seed...) would issue different numbers
      // of collectives of different sizes: a hang or an abort inside the transport later.
      std::optional<std::size_t> batches;  // (without even_batches the counts may differ by design)
      if constexpr (requires { loader.size(); })
        if (ctx_.core.options.data.even_batches) batches = loader.size();
      const auto check =
          detail::loader_check(loader.state_dict(), batches, count(detail::CheckpointEntry::Kind::dataloader));
      ctx_.engine.check_same_on_every_rank(check.key, check.value, check.subject);
    }
    ctx_.core.checkpoint.add(checkpoint::Entry::Kind::dataloader, checkpoint::EntryOwner::main_rank, loader);
    return loader;
  }

  std::size_t count(detail::CheckpointEntry::Kind kind) const { return ctx_.core.checkpoint.count(kind); }

  /// A seed drawn from torch's CPU generator on rank 0 and shared by all ranks.
  std::uint64_t shared_random_seed() { return distributed::broadcast_seed(ctx_.engine, detail::draw_random_seed()); }

  void refuse_nonfinite_loss(const at::Tensor& loss) {
    const auto call = ++ctx_.core.losses_checked;
    std::optional<std::size_t> micro_step;
    if constexpr (accumulating) micro_step = ctx_.accumulation.step();
    detail::refuse_nonfinite_loss(loss, call, micro_step, process_index(), num_processes());
  }

  // First: the process's memory settings apply before the engine allocates anything.
  [[no_unique_address]] detail::CpuMemorySettings cpu_memory_;
  context_type ctx_;
};

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/accelerator.ipp>
#endif
