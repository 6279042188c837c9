// TensorDataset: inputs and targets held as two tensors, read a whole batch at a time.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/ArrayRef.h>
#include <torch/data/example.h>

#include <accelerate/detail/check.hpp>

namespace accelerate::data {

/// A map-style dataset over two tensors with the same first dimension. get_batch() gathers a
/// batch with one index_select per tensor instead of stacking samples one by one.
/// Example:
///   accelerate::data::TensorDataset ds(torch::randn({100, 8}), torch::randint(0, 3, {100}));
///   auto [x, y] = ds.get_batch({0, 5, 7});   // x: [3, 8], y: [3]
class TensorDataset {
 public:
  using ExampleType = torch::data::Example<at::Tensor, at::Tensor>;
  using BatchType = ExampleType;

  TensorDataset(at::Tensor inputs, at::Tensor targets)
      : inputs_(std::move(inputs)), targets_(std::move(targets)) {
    ACCELERATE_CHECK(inputs_.defined() && targets_.defined() && inputs_.dim() > 0 &&
                         targets_.dim() > 0 && inputs_.size(0) == targets_.size(0),
                     "TensorDataset: inputs and targets need the same first dimension, got ",
                     inputs_.sizes(), " and ", targets_.sizes());
  }

  std::optional<std::size_t> size() const { return static_cast<std::size_t>(inputs_.size(0)); }

  ExampleType get(std::size_t index) const {
    const auto i = static_cast<int64_t>(index);
    return {inputs_[i], targets_[i]};
  }

  BatchType get_batch(c10::ArrayRef<int64_t> indices) const {
    const at::Tensor idx = at::tensor(indices, at::kLong);
    return {inputs_.index_select(0, idx), targets_.index_select(0, idx)};
  }

  const at::Tensor& inputs() const noexcept { return inputs_; }
  const at::Tensor& targets() const noexcept { return targets_; }

 private:
  at::Tensor inputs_;
  at::Tensor targets_;
};

}  // namespace accelerate::data
