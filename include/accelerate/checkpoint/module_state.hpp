// A module's parameters and buffers by dotted name, and strict loading into a module with an
// error that lists every missing key, unexpected key and shape or dtype mismatch.
#pragma once

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate::checkpoint {

/// Parameters and buffers under their dotted names ("fc1.weight", "bn.running_mean"), detached
/// from autograd, in PyTorch's state_dict order: module by module (pre-order, in registration
/// order), each module's own parameters then its own buffers. Shard boundaries of save_model
/// follow this order, so they match Python Accelerate's.
std::vector<std::pair<std::string, at::Tensor>> named_tensors(const torch::nn::Module& module);

/// What loading a state into a module found.
struct LoadReport {
  std::vector<std::string> missing_keys;      // in the module, not in the state
  std::vector<std::string> unexpected_keys;   // in the state, not in the module
  std::vector<std::string> mismatches;        // same key, other shape or dtype
  bool ok() const { return missing_keys.empty() && unexpected_keys.empty() && mismatches.empty(); }
  std::string describe() const;
};

/// What loading `state` into `module` would find, without changing the module: an error in
/// the same words as load_named_tensors, or nothing.
LoadReport check_named_tensors(const torch::nn::Module& module,
                               const std::map<std::string, at::Tensor>& state,
                               const std::string& source, bool strict = true);

/// Copies `state` into the module's parameters and buffers by name (to their devices). Strict:
/// any missing or unexpected key or mismatch is an error naming `source` and listing them all;
/// non-strict: matching keys are loaded and mismatches of shape or dtype are still errors.
LoadReport load_named_tensors(torch::nn::Module& module,
                              const std::map<std::string, at::Tensor>& state,
                              const std::string& source, bool strict = true);

}  // namespace accelerate::checkpoint

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/checkpoint/module_state.ipp>
#endif
