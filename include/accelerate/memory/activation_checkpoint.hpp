// activation_checkpoint: a block's forward that keeps none of its activations, recomputed in
// backward (torch.utils.checkpoint, which LibTorch lacks), with the RNG and autocast state of
// the forward so that dropout masks and precisions are the same.
#pragma once

#include <concepts>
#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <accelerate/detail/linkage.hpp>
#include <accelerate/distributed/units.hpp>

namespace accelerate::memory {

/// A checkpointed block with its types erased: its input tensors in, its output tensors out.
using CheckpointedFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// What activation_checkpoint does once the block's types are erased: runs `function` on
/// `inputs` with autograd off and returns its outputs attached to one autograd node that holds
/// only `inputs` (and the RNG and autocast state). That node's backward runs `function` again,
/// with autograd on, the saved RNG and autocast state, and returns the gradients of `inputs`
/// and of `parameters` (those the block reads that require a gradient) to the outer
/// backward: the parameters' gradients arrive there as from any other node, so gradient
/// hooks (a data-parallel reducer's) fire in the outer backward, never in a nested one.
std::vector<at::Tensor> run_checkpointed(CheckpointedFunction function, const std::vector<at::Tensor>& inputs,
                                         const std::vector<at::Tensor>& parameters);

namespace detail {

/// A block's result as a list of tensors and back: a tensor, a vector or a tuple of tensors.
template <class R>
struct CheckpointResult;

template <>
struct CheckpointResult<at::Tensor> {
  static std::vector<at::Tensor> flatten(at::Tensor t) { return {std::move(t)}; }
  static at::Tensor restore(std::vector<at::Tensor> v) { return std::move(v.front()); }
};

template <>
struct CheckpointResult<std::vector<at::Tensor>> {
  static std::vector<at::Tensor> flatten(std::vector<at::Tensor> v) { return v; }
  static std::vector<at::Tensor> restore(std::vector<at::Tensor> v) { return v; }
};

template <class... T>
  requires(std::same_as<T, at::Tensor> && ...)
struct CheckpointResult<std::tuple<T...>> {
  static std::vector<at::Tensor> flatten(std::tuple<T...> t) {
    return std::apply([](auto&... xs) { return std::vector<at::Tensor>{std::move(xs)...}; }, t);
  }
  static std::tuple<T...> restore(std::vector<at::Tensor> v) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return std::tuple<T...>(std::move(v[I])...); }(
        std::index_sequence_for<T...>{});
  }
};

}  // namespace detail

/// Runs `fn(inputs...)` (tensors in; a tensor, vector or tuple of tensors out) without keeping
/// the activations inside it: only the inputs are kept, and backward recomputes the block with
/// the forward's RNG state (dropout draws the same masks) and autocast state (the same
/// precisions) before backpropagating through it. `parameters` are the tensors the block reads
/// besides its inputs that need gradients (a module's parameters()); they receive their
/// gradients from the outer backward, so data parallel's reducer sees them as usual.
/// Activation memory then follows one block plus the inputs of every block, for one more
/// forward of each block in backward (bench/README.md, "Activation checkpointing").
/// The block runs twice: side effects (a BatchNorm's running statistics) happen twice, as in
/// PyTorch. `fn` is copied into the autograd graph: capture what outlives the backward.
/// Example:
///   h = accelerate::activation_checkpoint(block->parameters(), [block](const at::Tensor& x) mutable {
///     return block->forward(x);
///   }, h);
template <class Fn, class... Inputs>
  requires(std::same_as<Inputs, at::Tensor> && ...) && std::invocable<Fn&, const Inputs&...>
auto activation_checkpoint(std::vector<at::Tensor> parameters, Fn fn, const Inputs&... inputs) {
  using Result = std::decay_t<std::invoke_result_t<Fn&, const Inputs&...>>;
  using Convert = detail::CheckpointResult<Result>;
  CheckpointedFunction erased = [fn = std::move(fn)](const std::vector<at::Tensor>& in) mutable {
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return Convert::flatten(fn(in[I]...)); }(
        std::index_sequence_for<Inputs...>{});
  };
  return Convert::restore(run_checkpointed(std::move(erased), std::vector<at::Tensor>{inputs...}, parameters));
}

/// The same for a module: runs `block`'s forward on `inputs` checkpointed, its parameters()
/// receiving their gradients. The forward goes through accelerate::unit_forward, so a
/// stage-3 unit (DdpOptions::shard_units) is gathered for the forward and again for the
/// recompute, and released after each; anywhere else that is the plain call.
/// Example (a transformer's forward):
///   for (auto& layer : layers) h = accelerate::activation_checkpoint(layer, h);
template <class ModuleType, class... Inputs>
  requires(std::same_as<Inputs, at::Tensor> && ...)
auto activation_checkpoint(const torch::nn::ModuleHolder<ModuleType>& block, const Inputs&... inputs) {
  return activation_checkpoint(
      block->parameters(),
      [block = block](const Inputs&... xs) mutable { return distributed::unit_forward(block, xs...); }, inputs...);
}

}  // namespace accelerate::memory

namespace accelerate {
using memory::activation_checkpoint;
}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/memory/activation_checkpoint.ipp>
#endif
