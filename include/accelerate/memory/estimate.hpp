// estimate_memory: the bytes one rank holds for a prepared model's parameters, gradients and
// optimizer state under the accelerator's Backend (Accelerate's `accelerate estimate-memory`,
// for the configuration actually prepared rather than a model name).
#pragma once

#include <cstdint>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Type.h>
#include <torch/nn/module.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <accelerate/detail/check.hpp>
#include <accelerate/distributed/engine.hpp>
#include <accelerate/prepared/preparable.hpp>

namespace accelerate::memory {

/// Bytes one rank holds between a synchronised backward and the next zero_grad, by kind.
/// Activations are not included (they depend on the batch, and the Precision policy's autocast
/// only changes them: parameters, gradients and optimizer state stay in the parameters' dtype).
struct MemoryEstimate {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  std::int64_t total() const noexcept { return parameters + gradients + optimizer_state; }
};

/// "parameters 1.23 MB, gradients 1.23 MB, optimizer state 2.46 MB, total 4.92 MB" (MB = 1e6 B).
inline std::ostream& operator<<(std::ostream& out, const MemoryEstimate& m) {
  std::ostringstream text;
  const auto mb = [&](std::int64_t bytes) -> std::ostringstream& {
    text << std::fixed << std::setprecision(2) << static_cast<double>(bytes) / 1e6 << " MB";
    return text;
  };
  text << "parameters ";
  mb(m.parameters) << ", gradients ";
  mb(m.gradients) << ", optimizer state ";
  mb(m.optimizer_state) << ", total ";
  mb(m.total());
  return out << text.str();
}

/// How many tensors the size of its parameters a param group's optimizer keeps once it has
/// stepped, from torch::optim's sources: SGD a momentum buffer when momentum != 0; Adam and
/// AdamW two moments, three with amsgrad; RMSprop square_avg, plus momentum_buffer when
/// momentum != 0 and grad_avg when centered; Adagrad its sum. Their step counts are integers,
/// not tensors. Another optimizer (LBFGS, a user's) is an accelerate::Error naming its type.
inline int state_tensors_per_parameter(const torch::optim::OptimizerOptions& options) {
  using namespace torch::optim;
  if (const auto* sgd = dynamic_cast<const SGDOptions*>(&options)) return sgd->momentum() != 0 ? 1 : 0;
  if (const auto* adam = dynamic_cast<const AdamOptions*>(&options)) return adam->amsgrad() ? 3 : 2;
  if (const auto* adamw = dynamic_cast<const AdamWOptions*>(&options)) return adamw->amsgrad() ? 3 : 2;
  if (const auto* rmsprop = dynamic_cast<const RMSpropOptions*>(&options))
    return 1 + (rmsprop->momentum() != 0 ? 1 : 0) + (rmsprop->centered() ? 1 : 0);
  if (dynamic_cast<const AdagradOptions*>(&options)) return 1;
  accelerate::detail::fail("estimate_memory: the state of an optimizer with options of type ",
                           c10::demangle(typeid(options).name()),
                           " is unknown; SGD, Adam, AdamW, RMSprop and Adagrad are");
}

namespace detail {
inline std::int64_t tensor_bytes(const at::Tensor& t) { return static_cast<std::int64_t>(t.nbytes()); }
}  // namespace detail

/// What one rank holds for `model` trained by `optimizer` (both prepared by `acc`, or the
/// objects behind them), computed from their shapes and the Backend's layout:
///   - parameters: every parameter of the model, whole (stages 1 and 2 keep them whole; stage
///     3 keeps this rank's slice of each bucket, as for its gradients, between steps);
///   - gradients: one copy of the trainable parameters; two with several processes and
///     DdpOptions::gradient_as_bucket_view off (the .grad and the buckets), each bucket padded
///     to a multiple of the world size where it is summed in rank order (DdpOptions::
///     sum_in_rank_order). Zero stage 1 keeps the averaged buckets (one copy, padded alike;
///     its slices are views of them); stage 2 only this rank's
///     slice of each bucket — 1/W of it, rounded up, so the last ranks' share of the padding
///     counts too (given the prepared model; given the module, the slices the optimizer's
///     param groups hold);
///   - optimizer state: state_tensors_per_parameter for each param group times the bytes of
///     its parameters (a sharded optimizer's groups hold this rank's slices).
/// Gradient compression's own state (PowerSGD's factors) is not counted.
/// Example:
///   auto [model, opt] = acc.prepare(net, adamw);
///   std::cout << accelerate::estimate_memory(acc, model, opt) << "\n";
template <class Acc, class Model, class Optimizer>
MemoryEstimate estimate_memory(const Acc& acc, Model& model, Optimizer& optimizer) {
  using Engine = typename Acc::engine_type;
  const torch::nn::Module* module = nullptr;
  if constexpr (requires { model.unwrap(); }) module = accelerate::detail::impl_pointer(model.unwrap());
  else module = accelerate::detail::impl_pointer(model);
  const torch::optim::Optimizer* torch_optimizer = nullptr;
  if constexpr (requires { optimizer.unwrap(); }) torch_optimizer = &optimizer.unwrap();
  else torch_optimizer = &optimizer;

  MemoryEstimate estimate;
  std::int64_t trainable = 0;
  for (const auto& p : module->parameters(/*recurse=*/true)) {
    estimate.parameters += detail::tensor_bytes(p);
    if (p.requires_grad()) trainable += detail::tensor_bytes(p);
  }
  std::int64_t slices = 0;
  for (const auto& group : torch_optimizer->param_groups()) {
    std::int64_t group_bytes = 0;
    for (const auto& p : group.params()) group_bytes += detail::tensor_bytes(p);
    slices += group_bytes;
    estimate.optimizer_state += state_tensors_per_parameter(group.options()) * group_bytes;
  }
  // The buckets of a prepared model's reducer: the trainable parameters, each bucket padded to
  // a multiple of the world size when its sums go in rank order (else `trainable`).
  std::int64_t buckets = trainable;
  const auto for_each_bucket = [&](const auto& reducer, auto&& add) {
    const std::int64_t world = acc.num_processes();
    for (const auto& bucket : reducer.bucket_layout()) {
      std::int64_t elements = 0;
      for (const std::size_t index : bucket) elements += reducer.numel_of(index);
      add((elements + world - 1) / world, world, reducer.parameters()[bucket.front()].element_size());
    }
  };
  if constexpr (requires { model.model_sync().reducer(); }) {
    const auto* reducer = model.model_sync().reducer();
    if (reducer != nullptr && reducer->sums_in_rank_order()) {
      buckets = 0;
      for_each_bucket(*reducer, [&](std::int64_t slice, std::int64_t world, std::int64_t element_size) {
        buckets += slice * world * element_size;
      });
    }
  }
  if constexpr (requires { Engine::stage; }) {
    estimate.gradients = Engine::stage == 1 ? buckets : slices;
    if constexpr (requires { model.model_sync().reducer(); }) {
      const auto* reducer = model.model_sync().reducer();
      if (Engine::stage >= 2 && reducer != nullptr) {
        estimate.gradients = 0;
        for_each_bucket(*reducer, [&](std::int64_t slice, std::int64_t, std::int64_t element_size) {
          estimate.gradients += slice * element_size;
        });
        // Stage 3's released parameters are empty tensors (counted 0 above); it keeps a slice.
        if (Engine::stage == 3) estimate.parameters += estimate.gradients;
      }
    }
  } else {
    const bool copies = Engine::distributed && acc.num_processes() > 1 && !acc.options().ddp.gradient_as_bucket_view;
    estimate.gradients = copies ? trainable + buckets : buckets;
  }
  return estimate;
}

}  // namespace accelerate::memory

namespace accelerate {
using memory::estimate_memory;
using memory::MemoryEstimate;
}  // namespace accelerate
