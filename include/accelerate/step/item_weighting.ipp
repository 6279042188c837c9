// Bodies of item_weighting.hpp (see detail/linkage.hpp).
#pragma once

#include <accelerate/detail/check.hpp>
#include <accelerate/step/item_weighting.hpp>

namespace accelerate::step {

ACCELERATE_INLINE void ItemWeighting::open_window_if_closed() {
  if (!weighed_all_) return;
  *this = ItemWeighting();
}

ACCELERATE_INLINE void ItemWeighting::add(std::int64_t n) {
  ACCELERATE_CHECK(n >= 0, "backward: num_items must be >= 0 (the number of items the loss sums over), got ", n);
  open_window_if_closed();
  ACCELERATE_CHECK(!plain_, "backward: this accumulation window mixes losses with num_items and plain backward(loss) "
                   "calls; a window's losses are either all sums over counted items or all means");
  counted_ = true;
  items_ += static_cast<double>(n);
}

ACCELERATE_INLINE void ItemWeighting::plain_backward() {
  open_window_if_closed();
  ACCELERATE_CHECK(!counted_, "backward: this accumulation window mixes losses with num_items and plain backward(loss) "
                   "calls; a window's losses are either all sums over counted items or all means");
  plain_ = true;
}

ACCELERATE_INLINE void ItemWeighting::weigh(const std::vector<at::Tensor>& holders, int world_size,
                                            const SumOverProcesses& sum) {
  if (!counted_) return;
  if (!weighed_all_) {
    const double total = sum(items_);
    ACCELERATE_CHECK(total > 0, "backward: the losses of this accumulation window were sums over num_items items, "
                     "and the items of every micro-step and process sum to ", total, "; the mean over no item is undefined");
    factor_ = static_cast<double>(world_size) / total;
    weighed_all_ = true;
  }
  for (const at::Tensor& holder : holders) {
    const at::Tensor& grad = holder.grad();
    if (!grad.defined() || !weighed_.insert(holder.unsafeGetTensorImpl()).second) continue;
    grad.mul_(factor_);
  }
}

ACCELERATE_INLINE void ItemWeighting::save_to(StateDict& state) const {
  if (counted_ && !weighed_all_) state.values["window_items"] = items_;
}

ACCELERATE_INLINE void ItemWeighting::load_from(const StateDict& state) {
  *this = ItemWeighting();
  if (state.values.contains("window_items")) {
    counted_ = true;
    items_ = state.value<double>("window_items");
  }
}

}  // namespace accelerate::step
