// Layout agreement before a user-facing collective: every rank describes the tensor it passes
// (which collective, its argument, dtype and shape) in one small fixed-size all-gather, and all
// ranks reach the same verdict from the same descriptions. A collective whose sizes differ is
// then an accelerate::Error naming both ranks, raised on every rank, instead of Gloo aborting
// the process ("Received data size doesn't match expected size") or a peer waiting forever.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate::distributed {

/// The user-facing collectives a layout describes.
enum class CollectiveKind : std::int64_t { gather = 1, reduce, pad, broadcast };

const char* collective_name(CollectiveKind kind);

/// What one rank passes to a collective.
struct TensorLayout {
  CollectiveKind kind{};
  std::int64_t argument = 0;  // the reduction, the padded dim, or the broadcast's root
  at::ScalarType dtype = at::kFloat;
  std::vector<std::int64_t> shape;

  /// "reduce(argument 0) of Float[2, 3]".
  std::string describe() const;
};

}  // namespace accelerate::distributed

namespace accelerate::detail {
inline constexpr std::int64_t layout_max_dims = 12;
inline constexpr std::int64_t layout_slots = 4 + layout_max_dims;  // kind, argument, dtype, ndim, sizes
}  // namespace accelerate::detail

namespace accelerate::distributed {

/// One rank's layout as `slots` int64 values on the CPU. A tensor of more dimensions than the
/// descriptor holds is described by its dimension count alone, so that every rank still takes
/// part in the exchange and all fail together.
at::Tensor encode_layout(CollectiveKind kind, std::int64_t argument, const at::Tensor& t);

TensorLayout decode_layout(const at::Tensor& encoded);

/// Checks that every rank's layout agrees with rank 0's: the same collective and argument,
/// dtype, dimension count, and sizes except along `free_dim` (-1: none may differ). Every rank
/// runs it on the same layouts, so each raises the same error, naming rank 0 and the first
/// rank that differs.
void check_layouts(const std::vector<TensorLayout>& layouts, std::int64_t free_dim = -1);

}  // namespace accelerate::distributed

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/distributed/layout_check.ipp>
#endif
