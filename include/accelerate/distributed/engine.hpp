// The engine concept: what every Backend policy's engine provides (where this process is, the
// collectives, the model-sync type), and the customisation points where a sharded engine
// differs from replicated data parallel. Each hook's default is DDP's behaviour, so an engine
// that replicates the model writes none of them.
//
// Adding a backend = a tag modelling BackendPolicy (policy/backend.hpp), an engine modelling
// BackendEngine, and `detail::backend_engine<Tag>` naming it; the conformance suite
// (tests/distributed/engine_conformance_test.cpp) proves the engine with one line.
#pragma once

#include <algorithm>
#include <concepts>
#include <filesystem>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include <accelerate/checkpoint/module_state.hpp>
#include <accelerate/checkpoint/registry.hpp>
#include <accelerate/checkpoint/sharding.hpp>
#include <accelerate/distributed/reduction.hpp>
#include <accelerate/distributed/stats.hpp>
#include <accelerate/options.hpp>

namespace accelerate::distributed {

/// What a prepared model keeps to switch its gradient synchronisation on and off (no_sync,
/// accumulation). `set_sync(false)` makes the next backward leave gradients local.
template <class S>
concept ModelSync = std::movable<S> && requires(S& sync, const S& csync, bool enabled) {
  sync.set_sync(enabled);
  { csync.sync_enabled() } -> std::convertible_to<bool>;
};

/// The engine behind a Backend policy. Built once per Accelerator from the options and the
/// configuration fingerprint (which every rank must share), it answers:
///   - where this process is: rank(), world_size(), local_rank(), local_world_size(), and
///     device(options), the device models and batches go to;
///   - collective_device(): where the tensors its collectives take must live (CPU for Gloo,
///     this rank's GPU for NCCL);
///   - the collectives, all in place or returning new tensors, every rank calling them in the
///     same order: barrier(); all_reduce(t, reduction); broadcast(t, root); all_gather(t) ->
///     every rank's copy in rank order; reduce_scatter(t, reduction) -> this rank's
///     1/world_size slice (along dimension 0) of the element-wise reduction;
///   - stats(): calls and bytes per collective kind;
///   - check_same_on_every_rank(key, value, subject): an error on every rank when `value`
///     differs (prepare compares loaders and models with it before any collective);
///   - make_model_sync(module, name, options): what a prepared model keeps (a ModelSync).
/// `distributed` says whether any of it talks to another process; when false the
/// accelerator's collectives return their input at compile time.
/// Example (a new engine proves itself against the conformance suite):
///   static_assert(accelerate::distributed::BackendEngine<MyEngine>);
template <class E>
concept BackendEngine =
    std::constructible_from<E, const AcceleratorOptions&, std::string_view> &&
    ModelSync<typename E::ModelSync> &&
    requires(E& engine, const E& cengine, at::Tensor& tensor, const at::Tensor& input,
             const AcceleratorOptions& options, torch::nn::Module& module, const std::string& text,
             Reduction reduction, int root) {
      { E::distributed } -> std::convertible_to<bool>;
      { cengine.rank() } -> std::convertible_to<int>;
      { cengine.world_size() } -> std::convertible_to<int>;
      { cengine.local_rank() } -> std::convertible_to<int>;
      { cengine.local_world_size() } -> std::convertible_to<int>;
      { cengine.device(options) } -> std::convertible_to<c10::Device>;
      { cengine.collective_device() } -> std::convertible_to<c10::Device>;
      engine.barrier();
      engine.all_reduce(tensor, reduction);
      engine.broadcast(tensor, root);
      { engine.all_gather(input) } -> std::same_as<std::vector<at::Tensor>>;
      { engine.reduce_scatter(input, reduction) } -> std::same_as<at::Tensor>;
      { cengine.stats() } -> std::convertible_to<CommStats>;
      engine.check_same_on_every_rank(text, text, text);
      { engine.make_model_sync(module, text, options) } -> std::same_as<typename E::ModelSync>;
    };

// --- customisation points ------------------------------------------------------------------
// An engine overrides one by declaring the member of the same name; otherwise the default,
// replicated data parallel's behaviour, applies.

/// Called once when an optimizer is prepared, before anything else reads its parameters.
/// Default: nothing, the optimizer steps every parameter. A sharded engine narrows the param
/// groups to the shard this rank owns, so the optimizer's state only ever holds that shard.
template <class E>
void adopt_optimizer(E& engine, torch::optim::Optimizer& optimizer) {
  if constexpr (requires { engine.adopt_optimizer(optimizer); }) engine.adopt_optimizer(optimizer);
}

/// The checkpoint entry of a prepared optimizer, given the replicated one (`entry`: written by
/// the main rank). Default: that entry. A sharded engine makes it each rank's own (one file
/// per rank) and records which slice of which parameter each state tensor is.
template <class E>
checkpoint::Entry optimizer_entry(E& engine, const torch::optim::Optimizer& optimizer, checkpoint::Entry entry) {
  if constexpr (requires { engine.optimizer_entry(optimizer, entry); })
    return engine.optimizer_entry(optimizer, std::move(entry));
  else return entry;
}

/// The checkpoint entry of a prepared model, given the replicated one (`entry`: its
/// parameters and buffers, written by the main rank). Default: that entry. An engine that
/// shards the parameters makes it each rank's own, with a manifest of the slices it holds.
template <class E>
checkpoint::Entry model_entry(E& engine, const torch::nn::Module& module, checkpoint::Entry entry) {
  if constexpr (requires { engine.model_entry(module, entry); })
    return engine.model_entry(module, std::move(entry));
  else return entry;
}

/// Makes the inf/NaN flag of an fp16 step (`found_inf`, one element) the same on every rank
/// before the step is taken or skipped. Default: nothing, gradients are replicated so every
/// rank found the same. A sharded engine, whose ranks each checked their own shard, reduces
/// it (max) so all ranks skip together.
template <class E>
void agree_on_found_inf(E& engine, at::Tensor& found_inf) {
  if constexpr (requires { engine.agree_on_found_inf(found_inf); }) engine.agree_on_found_inf(found_inf);
}

/// Runs a prepared optimizer's step once gradients are final (after unscaling and clipping).
/// Default: every rank steps its whole optimizer on its (all-reduced, identical) gradients.
/// A sharded engine steps only the shard it owns and then gathers the parameters.
template <class E, class Optimizer>
void step_optimizer(E& engine, Optimizer& optimizer) {
  if constexpr (requires { engine.step_optimizer(optimizer); }) engine.step_optimizer(optimizer);
  else optimizer.step();
}

/// A prepared optimizer's zero_grad on an accumulation boundary. Default: the optimizer's own,
/// which clears every parameter's .grad. A sharded engine's optimizer holds this rank's slices,
/// so it also clears the model parameters' local gradients (those accumulated off the
/// boundary), which data parallel's zero_grad would have cleared.
template <class E>
void zero_grad(E& engine, torch::optim::Optimizer& optimizer, bool set_to_none) {
  if constexpr (requires { engine.zero_grad(optimizer, set_to_none); }) engine.zero_grad(optimizer, set_to_none);
  else optimizer.zero_grad(set_to_none);
}

/// Whether engine E runs optimizer steps itself (it declares step_optimizer): then every
/// prepared optimizer's step() goes through it, whatever the other policies.
template <class E>
inline constexpr bool customises_step_optimizer =
    requires(E& engine, torch::optim::Optimizer& optimizer) { engine.step_optimizer(optimizer); };

/// The tensors whose .grad hold this rank's gradients of `params`, for code that reads or
/// changes gradients by parameter (a user's clip_grad_norm_/clip_grad_value_, unscaling
/// before it). Default: the parameters themselves. A sharded engine, whose ranks keep only the
/// gradients of their slices, returns the slices of `params` this rank owns.
template <class E>
std::vector<at::Tensor> gradient_holders(E& engine, const std::vector<at::Tensor>& params) {
  if constexpr (requires { engine.gradient_holders(params); }) return engine.gradient_holders(params);
  else return params;
}

/// torch::nn::utils::clip_grad_norm_ on gradients this process holds whole, bit for bit, for
/// any bound. LibTorch divides the bound by the norm as a tensor of the gradients' type and
/// refuses a bound beyond float's range ("value cannot be converted to type float without
/// overflow") — yet the largest double is what a run passes to measure the norm and never
/// scale. A float norm is at most FLT_MAX or infinite, so FLT_MAX as the bound clips exactly
/// what any larger bound clips (nothing; an infinite norm scales them by zero either way).
inline double clip_whole_grad_norm(const std::vector<at::Tensor>& params, double max_norm, double norm_type) {
  return torch::nn::utils::clip_grad_norm_(
      params, std::min(max_norm, static_cast<double>(std::numeric_limits<float>::max())), norm_type);
}

/// Clips the gradients of `params` to a global `norm_type`-norm of at most `max_norm` and
/// returns the norm before clipping. Default: gradients are replicated, so the local norm is
/// the global one (torch::nn::utils::clip_grad_norm_, bit for bit). A sharded engine, whose
/// ranks each hold part of the gradients, reduces the norm's parts across ranks first.
template <class E>
double clip_grad_norm(E& engine, const std::vector<at::Tensor>& params, double max_norm, double norm_type) {
  if constexpr (requires { engine.clip_grad_norm(params, max_norm, norm_type); })
    return engine.clip_grad_norm(params, max_norm, norm_type);
  else return clip_whole_grad_norm(params, max_norm, norm_type);
}

/// Whether this rank writes the checkpoint state that every rank holds alike (models,
/// optimizers, schedulers, the grad scaler); each rank always writes its own RNG state.
/// Default: the main process, since replicated ranks hold identical copies. An engine whose
/// ranks hold different shards writes them on every rank.
template <class E>
bool writes_replicated_state(const E& engine) {
  if constexpr (requires { { engine.writes_replicated_state() } -> std::convertible_to<bool>; })
    return engine.writes_replicated_state();
  else return engine.rank() == 0;
}

/// Called by free_memory(): the engine forgets the prepared models and optimizers it tracks.
/// Default: nothing, a replicated engine tracks none (each model's reducer lives in its
/// prepared model). A sharded engine drops its parameter and optimizer-shard maps.
template <class E>
void release_prepared(E& engine) {
  if constexpr (requires { engine.release_prepared(); }) engine.release_prepared();
}

/// A model's full parameters and buffers (unwrapped names, state_dict order) on every rank,
/// for get_state_dict. Default: every rank holds them whole. A sharded engine gathers the
/// shards (collective: every rank calls it).
template <class E>
std::vector<std::pair<std::string, at::Tensor>> full_model_state(E& engine, const torch::nn::Module& module) {
  if constexpr (requires { engine.full_model_state(module); }) return engine.full_model_state(module);
  else return checkpoint::named_tensors(module);
}

/// save_model's files: a model's full parameters and buffers written as write_model_files
/// lays them out. Default: the ranks for which writes_replicated_state is true write the
/// tensors they hold. A sharded engine plans the files and gathers one output shard at a
/// time, so no rank holds more than one shard of the gathered model (collective: every rank
/// calls it).
template <class E>
void save_model_files(E& engine, const torch::nn::Module& module, const std::filesystem::path& dir,
                      const SaveModelOptions& options) {
  if constexpr (requires { engine.save_model_files(module, dir, options); })
    engine.save_model_files(module, dir, options);
  else if (writes_replicated_state(engine))
    checkpoint::write_model_files(checkpoint::named_tensors(module), dir, options);
}

}  // namespace accelerate::distributed
