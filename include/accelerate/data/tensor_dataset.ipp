// Bodies of tensor_dataset.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/data/tensor_dataset.hpp>

namespace accelerate::data {

ACCELERATE_INLINE TensorDataset::TensorDataset(at::Tensor inputs, at::Tensor targets)
    : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  ACCELERATE_CHECK(inputs_.defined() && targets_.defined() && inputs_.dim() > 0 && targets_.dim() > 0 &&
                       inputs_.size(0) == targets_.size(0),
                   "TensorDataset: inputs and targets need the same first dimension, got ", inputs_.sizes(), " and ",
                   targets_.sizes());
}

}  // namespace accelerate::data
