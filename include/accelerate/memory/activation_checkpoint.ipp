// Bodies of activation_checkpoint.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>

#include <ATen/Context.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <accelerate/compat/torch.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/memory/activation_checkpoint.hpp>

namespace accelerate::memory::detail {

/// The default generators' states of the devices a block ran on (the CPU's always, and each
/// accelerator device among its tensors), to draw the same random numbers again.
struct RngStates {
  std::vector<std::pair<c10::Device, at::Tensor>> states;

  static RngStates capture(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& parameters) {
    std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
    const auto note = [&](const at::Tensor& t) {
      if (t.defined() && !t.is_cpu() && std::find(devices.begin(), devices.end(), t.device()) == devices.end())
        devices.push_back(t.device());
    };
    for (const auto& t : inputs) note(t);
    for (const auto& t : parameters) note(t);
    RngStates rng;
    for (const auto& device : devices) {
      at::Generator generator = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(generator.mutex());
      rng.states.emplace_back(device, generator.get_state());
    }
    return rng;
  }
  void restore() const {
    for (const auto& [device, state] : states) {
      at::Generator generator = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(state);
    }
  }
};

/// Autocast's state on the CPU and CUDA, captured in the forward and set for the recompute.
struct AutocastStates {
  struct One {
    c10::DeviceType device;
    bool enabled;
    c10::ScalarType dtype;
  };
  std::vector<One> states;

  static AutocastStates capture() {
    AutocastStates autocast;
    for (const auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA})
      autocast.states.push_back({device, compat::autocast_enabled(device), compat::autocast_dtype(device)});
    return autocast;
  }
  bool any_enabled() const {
    return std::any_of(states.begin(), states.end(), [](const One& s) { return s.enabled; });
  }
  void apply() const {
    for (const auto& s : states) {
      compat::set_autocast_dtype(s.device, s.dtype);
      compat::set_autocast_enabled(s.device, s.enabled);
    }
  }
};

/// For the recompute: the forward's RNG and autocast state, and back to the present ones on
/// exit, whether the recompute returns or throws.
class RecomputeState {
 public:
  RecomputeState(const RngStates& rng, const AutocastStates& autocast, const std::vector<at::Tensor>& inputs,
                 const std::vector<at::Tensor>& parameters)
      : present_rng_(RngStates::capture(inputs, parameters)),
        present_autocast_(AutocastStates::capture()),
        nested_(autocast.any_enabled()) {
    rng.restore();
    autocast.apply();
    if (nested_) compat::autocast_increment_nesting();
  }
  ~RecomputeState() {
    // Autocast's cast cache lives until the outermost scope closes, as in torch.autocast.
    if (nested_ && compat::autocast_decrement_nesting() == 0) compat::autocast_clear_cache();
    present_autocast_.apply();
    present_rng_.restore();
  }
  RecomputeState(const RecomputeState&) = delete;
  RecomputeState& operator=(const RecomputeState&) = delete;

 private:
  RngStates present_rng_;
  AutocastStates present_autocast_;
  bool nested_;
};

/// The autograd node standing for a checkpointed block: its next edges are the block's inputs
/// then its parameters; its inputs (autograd's word) are the block's outputs.
struct RecomputeBackward final : torch::autograd::Node {
  CheckpointedFunction function;
  std::vector<at::Tensor> inputs;  // detached; sharing the version counters of the caller's
  std::vector<bool> input_requires_grad;
  std::vector<std::uint32_t> input_versions;
  std::vector<at::Tensor> parameters;
  RngStates rng;
  AutocastStates autocast;
  bool released = false;

  std::string name() const override { return "accelerate::ActivationCheckpointBackward"; }
  void release_variables() override {
    inputs.clear();
    released = true;
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    ACCELERATE_CHECK(!released, "activation_checkpoint: backward went through this block a second time, but its "
                     "inputs were freed by the first backward; pass retain_graph to keep them");
    for (std::size_t i = 0; i < inputs.size(); ++i)
      ACCELERATE_CHECK(!inputs[i].defined() || inputs[i]._version() == input_versions[i], "activation_checkpoint: input ",
                       i, " of the block was modified in place after the block ran (version ", input_versions[i],
                       " -> ", inputs[i]._version(), "); the recompute would read other values");
    std::vector<at::Tensor> leaves;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      at::Tensor leaf = inputs[i].defined() ? inputs[i].detach() : at::Tensor();
      if (input_requires_grad[i]) leaf.requires_grad_(true);
      leaves.push_back(std::move(leaf));
    }
    std::vector<at::Tensor> outputs;
    {
      const RecomputeState state(rng, autocast, inputs, parameters);
      at::AutoGradMode enable_grad(true);
      outputs = function(leaves);
    }
    ACCELERATE_CHECK(outputs.size() == grads.size(), "activation_checkpoint: the recompute returned ", outputs.size(),
                     " tensors, the forward ", grads.size(), "; the block must be deterministic in its structure");
    std::vector<at::Tensor> roots, root_grads;
    for (std::size_t j = 0; j < outputs.size(); ++j)
      if (grads[j].defined() && outputs[j].defined() && outputs[j].requires_grad()) {
        roots.push_back(outputs[j]);
        root_grads.push_back(grads[j]);
      }
    std::vector<at::Tensor> targets;
    std::vector<std::size_t> slot;  // where each target's gradient goes in the result
    for (std::size_t i = 0; i < leaves.size(); ++i)
      if (input_requires_grad[i]) {
        targets.push_back(leaves[i]);
        slot.push_back(i);
      }
    for (std::size_t k = 0; k < parameters.size(); ++k) {
      targets.push_back(parameters[k]);
      slot.push_back(inputs.size() + k);
    }
    torch::autograd::variable_list result(inputs.size() + parameters.size());
    if (roots.empty() || targets.empty()) return result;
    // grad(), not backward(): the gradients are captured, none accumulated in this nested run,
    // so every parameter's AccumulateGrad (and a reducer's hook on it) runs in the outer one.
    const auto found = torch::autograd::grad(roots, targets, root_grads, /*retain_graph=*/false,
                                             /*create_graph=*/false, /*allow_unused=*/true);
    for (std::size_t t = 0; t < found.size(); ++t) result[slot[t]] = found[t];
    return result;
  }
};

}  // namespace accelerate::memory::detail

namespace accelerate::memory {

ACCELERATE_INLINE std::vector<at::Tensor> run_checkpointed(CheckpointedFunction function, const std::vector<at::Tensor>& inputs,
                                                           const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> trained;
  for (const auto& p : parameters)
    if (p.defined() && p.requires_grad()) trained.push_back(p);
  const bool differentiable =
      at::GradMode::is_enabled() &&
      (!trained.empty() || std::any_of(inputs.begin(), inputs.end(), [](const at::Tensor& t) {
         return t.defined() && t.requires_grad();
       }));
  if (!differentiable) return function(inputs);  // evaluation: nothing to save or recompute

  auto node = std::shared_ptr<detail::RecomputeBackward>(new detail::RecomputeBackward(), torch::autograd::deleteNode);
  node->rng = detail::RngStates::capture(inputs, trained);
  node->autocast = detail::AutocastStates::capture();
  std::vector<at::Tensor> outputs;
  {
    at::NoGradGuard no_grad;
    outputs = function(inputs);
  }
  for (const auto& t : inputs) {
    node->inputs.push_back(t.defined() ? t.detach() : at::Tensor());
    node->input_requires_grad.push_back(t.defined() && t.requires_grad());
    node->input_versions.push_back(t.defined() ? t._version() : 0);
  }
  node->set_next_edges(torch::autograd::collect_next_edges(inputs, trained));
  node->parameters = std::move(trained);
  node->function = std::move(function);
  for (auto& output : outputs) {
    if (!output.defined() || !torch::autograd::isDifferentiableType(output.scalar_type())) {
      node->add_input_metadata(torch::autograd::Node::undefined_input());
      continue;
    }
    // A block that returns (a view of) its input: its own tensor, so that the history set on
    // it is not the input's.
    if (output.is_view() || std::any_of(inputs.begin(), inputs.end(), [&](const at::Tensor& t) {
          return t.defined() && t.is_alias_of(output);
        }))
      output = output.detach().clone();
    torch::autograd::set_history(output, node);
  }
  return outputs;
}

}  // namespace accelerate::memory
