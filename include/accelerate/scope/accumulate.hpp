// The scopes returned by Accelerator::accumulate() and no_sync(): empty types when there is
// nothing to skip, otherwise RAII switches of the models' gradient synchronisation. Every scope
// is [[nodiscard]]: `acc.accumulate(model);` as a statement would end the scope at once.
#pragma once

#include <array>
#include <cstddef>

namespace accelerate {

/// accumulate() without accumulation: every micro-step synchronises, known at compile time.
/// Example:
///   auto step = acc.accumulate(model);
///   static_assert(decltype(step)::sync_gradients());
struct [[nodiscard, maybe_unused]] AlwaysSyncScope {
  static constexpr bool sync_gradients() noexcept { return true; }
};

/// accumulate() with accumulation: whether this micro-step is a boundary, and (distributed) the
/// models whose gradient sync was switched off for it, restored to what it was when the scope
/// ends (an accumulate() inside no_sync() stays silent).
template <class ModelSync, std::size_t N>
class [[nodiscard, maybe_unused]] AccumulateScope {
 public:
  /// `communicate`: whether the models' gradients are synchronised in this micro-step (the
  /// boundary, or every micro-step with AccumulationOptions::sync_each_batch).
  AccumulateScope(bool sync_gradients, bool communicate, std::array<ModelSync*, N> models) noexcept
      : sync_gradients_(sync_gradients), models_(models) {
    for (std::size_t i = 0; i < N; ++i) {
      previous_[i] = models_[i]->sync_enabled();
      if (!communicate) models_[i]->set_sync(false);
    }
  }
  ~AccumulateScope() {
    for (std::size_t i = 0; i < N; ++i) models_[i]->set_sync(previous_[i]);
  }
  AccumulateScope(const AccumulateScope&) = delete;
  AccumulateScope& operator=(const AccumulateScope&) = delete;

  /// True on the micro-step that completes an accumulation window.
  bool sync_gradients() const noexcept { return sync_gradients_; }

 private:
  bool sync_gradients_;
  std::array<ModelSync*, N> models_;
  std::array<bool, N> previous_{};
};

/// The same, when there is nothing to switch (one process): only the boundary flag.
template <class ModelSync>
class [[nodiscard, maybe_unused]] AccumulateScope<ModelSync, 0> {
 public:
  AccumulateScope(bool sync_gradients, bool /*communicate*/, std::array<ModelSync*, 0>) noexcept
      : sync_gradients_(sync_gradients) {}
  // User-provided, so that `auto step = acc.accumulate(model);` is not "set but not used".
  ~AccumulateScope() {}
  AccumulateScope(const AccumulateScope&) = delete;
  AccumulateScope& operator=(const AccumulateScope&) = delete;
  bool sync_gradients() const noexcept { return sync_gradients_; }

 private:
  bool sync_gradients_;
};

/// no_sync(): gradients of the given models are not communicated until the scope ends (they
/// accumulate locally, as DDP's no_sync). Empty with one process.
template <class ModelSync, std::size_t N>
class [[nodiscard, maybe_unused]] NoSyncScope {
 public:
  explicit NoSyncScope(std::array<ModelSync*, N> models) noexcept : models_(models) {
    for (std::size_t i = 0; i < N; ++i) {
      previous_[i] = models_[i]->sync_enabled();
      models_[i]->set_sync(false);
    }
  }
  ~NoSyncScope() {
    for (std::size_t i = 0; i < N; ++i) models_[i]->set_sync(previous_[i]);
  }
  NoSyncScope(const NoSyncScope&) = delete;
  NoSyncScope& operator=(const NoSyncScope&) = delete;

 private:
  std::array<ModelSync*, N> models_;
  std::array<bool, N> previous_{};
};

template <class ModelSync>
class [[nodiscard, maybe_unused]] NoSyncScope<ModelSync, 0> {
 public:
  explicit constexpr NoSyncScope(std::array<ModelSync*, 0>) noexcept {}
  // User-provided (and empty), so that an unused scope variable draws no warning.
  ~NoSyncScope() {}
};

}  // namespace accelerate
