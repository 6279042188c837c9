// The checkpoint registry: everything save_state/load_state visit, each entry a Stateful
// handle with its kind (which names its file) and its owner (which rank writes it). Prepared
// models, optimizers, schedulers and dataloaders, registered user objects, the grad scaler and
// the micro-step counter all enter through the same two calls, so a new kind of state (a
// sharded optimizer's per-rank shard, say) is one more `add`.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

#include <accelerate/checkpoint/module_state.hpp>
#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/diagnostics.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate::checkpoint {

/// Which rank writes an entry.
enum class EntryOwner {
  /// State every rank holds alike: one file, written by the rank(s) the engine names
  /// (distributed::writes_replicated_state; the main process for data parallel) and read
  /// by every rank.
  main_rank,
  /// This rank's own state: written by every rank into random_states_<rank>, beside its RNGs.
  every_rank,
};

/// One object save_state/load_state visit, with how to read and restore its state. `check`,
/// when set, finds every problem `load` would meet without changing anything (load_state
/// applies such entries last, so it never has to undo them). `reshard`, for state each rank
/// owns, makes this rank's state out of every saved rank's, for a checkpoint written by
/// another number of processes (a sharded optimizer re-cuts its slices); without it such a
/// checkpoint is refused. `laid_out_otherwise`, with `reshard`, tells from this rank's saved
/// state that the same number of processes cut it otherwise (another ZeRO stage or bucket
/// size, which the configuration check let through): it is re-cut as well.
struct Entry {
  /// What the entry is: it names its file (state_stem) and is counted in the manifest.
  /// `precision` (the Precision policy's state: Fp16's grad scaler), `micro_step` and
  /// `gradient_sync` (a prepared model's bucket layout) are the accelerator's own step states,
  /// not user objects.
  enum class Kind { model, optimizer, scheduler, dataloader, custom, precision, micro_step, gradient_sync };
  Kind kind;
  EntryOwner owner = EntryOwner::main_rank;
  std::function<StateDict()> save;
  std::function<void(const StateDict&)> load;
  std::function<void(const StateDict&)> check = {};
  std::function<StateDict(const std::vector<StateDict>& saved_by_rank)> reshard = {};
  std::function<bool(const StateDict& saved)> laid_out_otherwise = {};
  /// A step state's own file stem (the Precision policy names its file: Fp16's "scaler");
  /// empty: its kind's (state_stem).
  std::string stem = {};
};

/// Whether entries of `kind` are the accelerator's step states rather than objects (not
/// counted in the manifest, not in Accelerator::checkpoint_entries()).
constexpr bool is_step_state(Entry::Kind kind) noexcept {
  return kind == Entry::Kind::precision || kind == Entry::Kind::micro_step || kind == Entry::Kind::gradient_sync;
}

/// Everything a checkpoint holds, in registration order.
/// Example:
///   accelerate::checkpoint::Registry registry;
///   registry.add(Entry::Kind::custom, EntryOwner::main_rank, std::ref(ema));  // any Stateful
class Registry {
 public:
  /// Adds a Stateful `handle` (held by value: prepared objects are handles; wrap a plain
  /// object in std::ref to refer to it).
  template <class Handle>
  void add(Entry::Kind kind, EntryOwner owner, Handle handle, std::function<void(const StateDict&)> check = {}) {
    add(entry(kind, owner, std::move(handle), std::move(check)));
  }

  /// The entry add(kind, owner, handle, check) would add, for a caller that adapts it first.
  template <class Handle>
  static Entry entry(Entry::Kind kind, EntryOwner owner, Handle handle, std::function<void(const StateDict&)> check = {}) {
    auto shared = std::make_shared<Handle>(std::move(handle));
    return {kind, owner, [shared] { return object(*shared).state_dict(); },
            [shared](const StateDict& s) { object(*shared).load_state_dict(s); }, std::move(check)};
  }

  /// Adds an entry made by hand.
  void add(Entry entry);

  /// A model's entry: its parameters and buffers by name, all checked before any is loaded.
  static Entry model_entry(std::shared_ptr<torch::nn::Module> module);

  /// Adds a user object by reference: anything Stateful, or a type with a checkpoint_adapter
  /// (Boost.Hana adapted structs, with <accelerate/checkpoint/reflect.hpp>).
  template <class T>
  void add_object(T& object) {
    if constexpr (Stateful<T>) {
      add(Entry::Kind::custom, EntryOwner::main_rank, std::ref(object));
    } else if constexpr (requires { checkpoint_adapter<T>::save(object); }) {
      add({Entry::Kind::custom, EntryOwner::main_rank, [&object] { return checkpoint_adapter<T>::save(object); },
           [&object](const StateDict& s) { checkpoint_adapter<T>::load(object, s); }});
    } else {
      static_assert(detail::dependent_false<T>,
                    "accelerate::register_for_checkpointing: the object needs state_dict() and "
                    "load_state_dict(const accelerate::StateDict&) members, or must be a "
                    "Boost.Hana adapted struct with <accelerate/checkpoint/reflect.hpp> included");
    }
  }

  /// Forgets the prepared models, optimizers, schedulers and dataloaders and the models'
  /// gradient-sync layouts (free_memory()); user objects and the accelerator's own step states
  /// stay registered.
  void release_prepared();

  /// Models, optimizers, schedulers, dataloaders and user objects, in registration order.
  const std::vector<Entry>& objects() const noexcept { return objects_; }
  /// The accelerator's step states (grad scaler, micro-step counter).
  const std::vector<Entry>& step_states() const noexcept { return step_states_; }

  /// How many entries of `kind` there are.
  std::size_t count(Entry::Kind kind) const;

 private:
  template <class Handle>
  static auto& object(Handle& handle) {
    if constexpr (requires { handle.get(); typename Handle::type; }) return handle.get();  // std::reference_wrapper
    else return handle;
  }

  std::vector<Entry> objects_;
  std::vector<Entry> step_states_;
};

}  // namespace accelerate::checkpoint

namespace accelerate::detail {
/// The registry's entry under the name the accelerator's first versions used.
using CheckpointEntry = checkpoint::Entry;
}  // namespace accelerate::detail

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/checkpoint/registry.ipp>
#endif
