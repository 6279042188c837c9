// A map-style dataset whose batches carry their dataset indices, so a rank can log which
// samples it was dealt (resharding and elastic-restart tests count them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/ArrayRef.h>

namespace accelerate::testing {

/// Inputs and targets; each batch is (x, y, indices).
struct IndexedDataset {
  at::Tensor x, y;
  std::size_t size() const { return static_cast<std::size_t>(x.size(0)); }
  std::tuple<at::Tensor, at::Tensor, at::Tensor> get_batch(c10::ArrayRef<int64_t> indices) const {
    const auto i = at::tensor(std::vector<int64_t>(indices.begin(), indices.end()));
    return {x.index_select(0, i), y.index_select(0, i), i};
  }
};

}  // namespace accelerate::testing
