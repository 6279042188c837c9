// TensorDataset: inputs and targets held as two tensors, read a whole batch at a time.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/ArrayRef.h>
#include <torch/data/example.h>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

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

  TensorDataset(at::Tensor inputs, at::Tensor targets);

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

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/data/tensor_dataset.ipp>
#endif
