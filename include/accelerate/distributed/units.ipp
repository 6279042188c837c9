// Bodies of units.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/distributed/units.hpp>

namespace accelerate::distributed {

ACCELERATE_INLINE void UnitBindings::bind(const torch::nn::Module* module, Binding binding) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(bindings_, [](const auto& item) { return item.second.units.expired(); });
  bindings_[module] = std::move(binding);
  count_.store(bindings_.size(), std::memory_order_release);
}

ACCELERATE_INLINE void UnitBindings::unbind(const ParameterUnits* units) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(bindings_, [units](const auto& item) {
    const auto held = item.second.units.lock();
    return !held || held.get() == units;
  });
  count_.store(bindings_.size(), std::memory_order_release);
}

ACCELERATE_INLINE std::optional<std::pair<std::shared_ptr<ParameterUnits>, UnitBindings::Binding>> UnitBindings::find(
    const torch::nn::Module* module) const {
  if (count_.load(std::memory_order_acquire) == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = bindings_.find(module);
  if (it == bindings_.end()) return std::nullopt;
  auto units = it->second.units.lock();
  if (!units) return std::nullopt;
  return std::make_pair(std::move(units), it->second);
}

}  // namespace accelerate::distributed
