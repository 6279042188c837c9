// Bodies of module_state.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/checkpoint/module_state.hpp>

namespace accelerate::checkpoint {

ACCELERATE_INLINE std::vector<std::pair<std::string, at::Tensor>> named_tensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto own = [&](const torch::nn::Module& m, const std::string& prefix) {
    for (const auto& p : m.named_parameters(/*recurse=*/false)) out.emplace_back(prefix + p.key(), p.value().detach());
    for (const auto& b : m.named_buffers(/*recurse=*/false)) out.emplace_back(prefix + b.key(), b.value().detach());
  };
  own(module, "");  // without include_self, which needs the module to be owned by a shared_ptr
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/false))
    own(*item.value(), item.key() + ".");
  return out;
}

ACCELERATE_INLINE std::string LoadReport::describe() const {
  std::ostringstream out;
  auto list = [&](const char* what, const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    out << "\n  " << what << " (" << keys.size() << "):";
    for (const auto& k : keys) out << " " << k;
  };
  list("missing keys", missing_keys);
  list("unexpected keys", unexpected_keys);
  list("shape/dtype mismatches", mismatches);
  return out.str();
}

ACCELERATE_INLINE LoadReport load_named_tensors(torch::nn::Module& module,
                                                const std::map<std::string, at::Tensor>& state,
                                                const std::string& source, bool strict) {
  const LoadReport report = check_named_tensors(module, state, source, strict);
  std::map<std::string, at::Tensor> targets;
  for (auto& item : module.named_parameters(true)) targets.emplace(item.key(), item.value());
  for (auto& item : module.named_buffers(true)) targets.emplace(item.key(), item.value());
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : targets) {
    const auto it = state.find(name);
    if (it != state.end()) target.copy_(it->second);
  }
  return report;
}

ACCELERATE_INLINE LoadReport check_named_tensors(const torch::nn::Module& module,
                                                 const std::map<std::string, at::Tensor>& state,
                                                 const std::string& source, bool strict) {
  LoadReport report;
  std::map<std::string, at::Tensor> targets;
  for (const auto& item : module.named_parameters(true)) targets.emplace(item.key(), item.value());
  for (const auto& item : module.named_buffers(true)) targets.emplace(item.key(), item.value());
  // Tied weights are saved once (under the first name); an alias sharing storage with a
  // tensor the state provides is not missing.
  std::set<const void*> provided_storage;
  for (const auto& [name, target] : targets)
    if (state.count(name)) provided_storage.insert(target.storage().data());
  for (const auto& [name, target] : targets) {
    const auto it = state.find(name);
    if (it == state.end()) {
      if (!provided_storage.count(target.storage().data())) report.missing_keys.push_back(name);
    } else if (it->second.sizes() != target.sizes() ||
               it->second.scalar_type() != target.scalar_type()) {
      std::ostringstream m;
      m << name << " (module " << target.scalar_type() << target.sizes() << ", file "
        << it->second.scalar_type() << it->second.sizes() << ")";
      report.mismatches.push_back(m.str());
    }
  }
  for (const auto& [name, unused] : state)
    if (!targets.count(name)) report.unexpected_keys.push_back(name);
  const bool fatal = strict ? !report.ok() : !report.mismatches.empty();
  ACCELERATE_CHECK(!fatal, "loading ", source, " into the model failed:", report.describe());
  return report;
}

}  // namespace accelerate::checkpoint
