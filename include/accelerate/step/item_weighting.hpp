// ItemWeighting: losses that are sums over items (tokens), weighed by the number of items in
// the whole accumulation window on every rank, so that the optimizer sees the mean over the
// window's items however they were split into micro-batches and ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>

#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate::step {

/// The accumulation window's item count (Accelerator::backward(loss_sum, {.num_items = n})).
/// Each such backward propagates the loss sum as it is (not divided by the window's length);
/// when the window's gradients are first read at its boundary (the optimizer step, or a clip
/// or unscale before it) the counts of every micro-step and rank are summed by one all-reduce
/// and every gradient is multiplied by world_size / total: the engine's average over ranks
/// times that is the gradient of (sum of all the window's item losses) / (their number).
/// The first backward after that starts the next window.
class ItemWeighting {
 public:
  /// Sums a double over the processes (the identity with one).
  using SumOverProcesses = std::function<double(double)>;

  /// Counts `n` items of the current window (n >= 0), opening a new window if the last was
  /// weighed. A window mixing these with plain backward(loss) calls is an error.
  void add(std::int64_t n);
  /// A plain backward(loss): refused inside a window of counted losses.
  void plain_backward();
  /// Whether the current window's losses are sums over counted items (until the next window).
  bool counted() const noexcept { return counted_; }

  /// Multiplies the gradient of each of `holders` not yet weighed in this window by
  /// world_size / total items; the first call of a window computes the total with `sum`,
  /// which every rank reaches at the same boundary. Does nothing when the window counted none.
  void weigh(const std::vector<at::Tensor>& holders, int world_size, const SumOverProcesses& sum);

  /// The window's progress when saved inside it: written only when it counted items.
  void save_to(StateDict& state) const;
  void load_from(const StateDict& state);

 private:
  void open_window_if_closed();

  bool counted_ = false;       // this window's losses carry num_items
  bool plain_ = false;         // this window had a plain backward(loss)
  bool weighed_all_ = false;   // the factor is known: the next backward opens a new window
  double items_ = 0;           // this rank's items in this window
  double factor_ = 0;          // world_size / total items, once known
  std::unordered_set<const void*> weighed_;  // gradient holders already multiplied
};

}  // namespace accelerate::step

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/step/item_weighting.ipp>
#endif
