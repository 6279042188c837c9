// GradientState: which prepared dataloaders are being iterated right now, and where the
// innermost one is. accumulate() and gather_for_metrics() read it; outside every loop it says
// "not in a dataloader", so nothing a finished loop saw leaks into later code.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace accelerate {

/// Accelerate's GradientState: a stack of the prepared dataloaders whose iteration is under
/// way. An iteration is pushed when `begin()` starts it and popped when it is exhausted or
/// its iterator is destroyed (a `break`, an exception), so nested loops report the innermost
/// loader and zipped loaders the one started last.
/// Example:
///   for (auto& batch : loader) {
///     if (acc.gradient_state().end_of_dataloader()) { ... }  // the epoch's last batch
///   }
///   acc.gradient_state().remainder();  // -1: no loop is running
class GradientState {
 public:
  /// Where one iteration of a loader is, updated on every batch it yields.
  struct Position {
    bool at_last_batch = false;  // the batch being processed is this rank's last of the epoch
    std::size_t remaining = 0;   // batches left in the epoch including this one; 0 = unknown
    std::int64_t remainder = -1; // real samples of the last global batch; -1 = unknown
  };

  /// One iteration's registration, alive while its iterator (or a copy) is.
  class Activation {
   public:
    explicit Activation(GradientState& state) : state_(&state) { state_->active_.push_back(this); }
    ~Activation() { release(); }
    Activation(const Activation&) = delete;
    Activation& operator=(const Activation&) = delete;

    void update(const Position& position) noexcept { position_ = position; }
    /// Leaves the stack early (the iteration ran out of batches).
    void release() noexcept {
      if (!state_) return;
      auto& active = state_->active_;
      active.erase(std::remove(active.begin(), active.end(), this), active.end());
      state_ = nullptr;
    }
    const Position& position() const noexcept { return position_; }

   private:
    GradientState* state_;
    Position position_;
  };

  /// Whether any prepared dataloader is being iterated.
  bool in_dataloader() const noexcept { return !active_.empty(); }

  /// Whether the innermost active loader is at its epoch's last batch; false outside loops.
  bool end_of_dataloader() const noexcept { return current().at_last_batch; }

  /// Accelerate's remainder: the number of real samples in the innermost active loader's last
  /// global batch (dataset size modulo batch size times processes; 0 when it divides or with
  /// drop_last). -1 outside loops and for loaders of unknown length.
  std::int64_t remainder() const noexcept { return current().remainder; }

  /// Batches left in the innermost active loader's epoch, the current one included; 0 outside
  /// loops or when the length is unknown.
  std::size_t remaining() const noexcept { return current().remaining; }

  /// Active iterations (nested or zipped loops).
  std::size_t depth() const noexcept { return active_.size(); }

 private:
  const Position& current() const noexcept {
    static constexpr Position none{};
    return active_.empty() ? none : active_.back()->position();
  }

  std::vector<Activation*> active_;
};

}  // namespace accelerate
