// Stage-3 units in any model: LibTorch modules have no forward hooks, so a model's forward
// runs each unit through unit_forward(), which gathers the unit's parameters for that call
// (and again for its backward) when the model was prepared by Zero<_, 3> with the unit named
// in DdpOptions::shard_units. With any other backend it is the plain call, so one model
// serves every backend.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>

#include <accelerate/compat/torch.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/distributed/parameter_units.hpp>

namespace accelerate::distributed {

/// Which stage-3 unit a module is, for unit_forward: bound by the sharded engine when it
/// prepares a model with DdpOptions::shard_units. Process-wide (a model's forward cannot be
/// handed the accelerator); a binding whose model is gone no longer applies.
class UnitBindings {
 public:
  struct Binding {
    std::weak_ptr<ParameterUnits> units;  // the prepared model's parameter store
    std::size_t unit = 0;
    std::optional<std::size_t> next, previous;  // the neighbours in the listed (forward) order
  };

  static UnitBindings& instance() {
    static UnitBindings bindings;
    return bindings;
  }

  /// Binds `module` (replacing an earlier binding) and drops bindings whose model is gone.
  void bind(const torch::nn::Module* module, Binding binding);

  /// Forgets the units of the model whose parameters `units` holds (free_memory()).
  void unbind(const ParameterUnits* units);

  /// The binding of `module`, if its model is still prepared. Without any binding in the
  /// process this is one atomic load.
  std::optional<std::pair<std::shared_ptr<ParameterUnits>, Binding>> find(const torch::nn::Module* module) const;

 private:
  mutable std::mutex mutex_;
  std::unordered_map<const torch::nn::Module*, Binding> bindings_;
  std::atomic<std::size_t> count_{0};
};

/// Runs `child` (a module holder such as torch::nn::Linear, or a module with a forward) on
/// `args` and returns what it returns. When `child` is a unit of a model prepared by
/// Zero<_, 3> (named in DdpOptions::shard_units), its parameters are gathered for the call
/// while the next listed unit's all-gather is started, and released after it; a hook on the
/// output gathers them again just before the unit's backward (while the previous listed
/// unit's is started), and they are released once their gradients are in. Called inside
/// backward (accelerate::activation_checkpoint's recompute of a unit) it gathers the unit once
/// for the recompute and the backward that follows it, keeps it gathered until its gradients
/// are in, and starts the previous listed unit's all-gather: the same all-gathers as without
/// checkpointing. A unit returning something other than a tensor stays gathered until its
/// gradients are in. Anywhere else
/// (data parallel, one process, an unlisted child) it is the plain call.
/// Every rank must run the same units in the same order (each gather is a collective), as
/// every rank runs the same forward under data parallel.
/// Example:
///   // Acc acc{{.ddp = {.shard_units = {"encoder", "head"}}}};  with Zero<Gloo, 3>
///   torch::Tensor forward(torch::Tensor x) {
///     x = accelerate::unit_forward(encoder, x);
///     return accelerate::unit_forward(head, torch::relu(x));
///   }
template <class Child, class... Args>
decltype(auto) unit_forward(Child& child, Args&&... args) {
  constexpr bool holder = requires { child.ptr(); };
  const torch::nn::Module* module = nullptr;
  if constexpr (holder) module = child.ptr().get();
  else module = &child;
  auto call = [&]() -> decltype(auto) {  // forward itself: a Sequential's holder cannot name its return type
    if constexpr (holder) return child->forward(std::forward<Args>(args)...);
    else return child.forward(std::forward<Args>(args)...);
  };
  using Output = decltype(call());
  const auto bound = UnitBindings::instance().find(module);
  if (!bound) return Output(call());
  ParameterUnits& units = *bound->first;
  const UnitBindings::Binding& binding = bound->second;
  units.gather_unit(binding.unit);
  // Inside backward this is an activation checkpoint's recompute, and this unit's backward
  // comes next: releasing it here would make that backward gather it again. It stays gathered
  // until its gradients are in (the store releases it then), and the unit whose backward
  // follows is the previous one, not the next.
  if (compat::in_backward()) {
    if (binding.previous) units.prefetch_unit(*binding.previous);
    return Output(call());
  }
  if (binding.next) units.prefetch_unit(*binding.next);
  Output output = call();
  const bool backward = torch::autograd::GradMode::is_enabled();
  if constexpr (std::is_same_v<std::decay_t<Output>, at::Tensor>) {
    if (backward && output.requires_grad())
      units.regather_in_backward(output, binding.unit, binding.previous.value_or(units.unit_count()));
    units.release_unit(binding.unit);
  } else if (!backward) {
    units.release_unit(binding.unit);
  }
  return output;
}

}  // namespace accelerate::distributed

namespace accelerate {
using distributed::unit_forward;
}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/distributed/units.ipp>
#endif
