// adopt_training_state: how every rank leaves join_uneven_inputs in step, taking the training
// state of the last rank to finish as a checkpoint would carry it.
#pragma once

#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <accelerate/checkpoint/registry.hpp>
#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/data/batch.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/distributed/collectives.hpp>
#include <accelerate/distributed/engine.hpp>

namespace accelerate::distributed {

/// The optimizers', schedulers', precision state's and micro-step counter's state of rank
/// `root` on every rank, as a checkpoint would carry it (the values as JSON text and the
/// tensors, one broadcast_packed per entry). The root takes every state first: one it cannot
/// take ends the call on every rank instead of leaving the others in a broadcast it never
/// joins. Collective.
template <BackendEngine E>
void adopt_training_state(E& engine, const checkpoint::Registry& registry, int root) {
  using Kind = checkpoint::Entry::Kind;
  using Packed = std::pair<std::string, std::map<std::string, at::Tensor>>;
  std::vector<const checkpoint::Entry*> entries;
  for (const auto& entry : registry.objects())
    if (entry.kind == Kind::optimizer || entry.kind == Kind::scheduler) entries.push_back(&entry);
  for (const auto& entry : registry.step_states())
    if (entry.kind == Kind::precision || entry.kind == Kind::micro_step) entries.push_back(&entry);
  const bool mine = engine.rank() == root;
  std::vector<Packed> sent(mine ? entries.size() : 0);
  std::exception_ptr failure;
  try {
    for (std::size_t i = 0; i < sent.size(); ++i) {
      StateDict state = entries[i]->save();
      sent[i] = {state.values.dump(), std::move(state.tensors)};
    }
  } catch (...) {
    failure = std::current_exception();
  }
  const int failed = first_flagged_rank(engine, failure != nullptr);
  if (failure) std::rethrow_exception(failure);
  ACCELERATE_CHECK(failed < 0, "join_uneven_inputs: rank ", failed, ", the last to finish, could not share its "
                   "optimizer, scheduler and scaler state (its own error names the cause)");
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto packed = broadcast_packed(engine, mine ? &sent[i] : nullptr, root);
    if (mine || !packed) continue;
    auto [values, tensors] = data::unpack_batch<Packed>(packed->first, packed->second);
    StateDict state;
    state.values = nlohmann::json::parse(values);
    state.tensors = std::move(tensors);
    entries[i]->load(state);
  }
}

}  // namespace accelerate::distributed
