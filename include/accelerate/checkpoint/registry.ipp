// Bodies of registry.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/checkpoint/registry.hpp>

namespace accelerate::checkpoint {

ACCELERATE_INLINE void Registry::add(Entry entry) {
  (is_step_state(entry.kind) ? step_states_ : objects_).push_back(std::move(entry));
}

ACCELERATE_INLINE Entry Registry::model_entry(std::shared_ptr<torch::nn::Module> module) {
  return {Entry::Kind::model, EntryOwner::main_rank,
          [module] {
            StateDict s;
            for (auto& [key, value] : named_tensors(*module)) s.tensors[key] = value;
            return s;
          },
          [module](const StateDict& s) { load_named_tensors(*module, s.tensors, "the saved state"); },
          [module](const StateDict& s) { check_named_tensors(*module, s.tensors, "the saved state"); }};
}

ACCELERATE_INLINE void Registry::release_prepared() {
  using Kind = Entry::Kind;
  std::erase_if(objects_, [](const Entry& e) {
    return e.kind == Kind::model || e.kind == Kind::optimizer || e.kind == Kind::scheduler || e.kind == Kind::dataloader;
  });
  std::erase_if(step_states_, [](const Entry& e) { return e.kind == Kind::gradient_sync; });
}

ACCELERATE_INLINE std::size_t Registry::count(Entry::Kind kind) const {
  const auto& list = is_step_state(kind) ? step_states_ : objects_;
  return static_cast<std::size_t>(
      std::count_if(list.begin(), list.end(), [&](const Entry& e) { return e.kind == kind; }));
}

}  // namespace accelerate::checkpoint
