// Bodies of layout_check.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/distributed/layout_check.hpp>

namespace accelerate::distributed {

ACCELERATE_INLINE const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::gather: return "gather";
    case CollectiveKind::reduce: return "reduce";
    case CollectiveKind::pad: return "pad_across_processes";
    case CollectiveKind::broadcast: return "broadcast";
  }
  return "an unknown collective";
}

ACCELERATE_INLINE std::string TensorLayout::describe() const {
  std::ostringstream out;
  out << collective_name(kind) << " of " << c10::toString(dtype) << "[";
  for (std::size_t d = 0; d < shape.size(); ++d) out << (d ? ", " : "") << shape[d];
  out << "]";
  return out.str();
}

ACCELERATE_INLINE at::Tensor encode_layout(CollectiveKind kind, std::int64_t argument, const at::Tensor& t) {
  at::Tensor out = at::zeros({detail::layout_slots}, at::kLong);
  auto* v = out.data_ptr<std::int64_t>();
  v[0] = static_cast<std::int64_t>(kind);
  v[1] = argument;
  v[2] = static_cast<std::int64_t>(t.scalar_type());
  v[3] = t.dim();
  for (std::int64_t d = 0; d < std::min<std::int64_t>(t.dim(), detail::layout_max_dims); ++d) v[4 + d] = t.size(d);
  return out;
}

ACCELERATE_INLINE TensorLayout decode_layout(const at::Tensor& encoded) {
  const at::Tensor cpu = encoded.to(at::kCPU, at::kLong).contiguous();
  const auto* v = cpu.data_ptr<std::int64_t>();
  TensorLayout layout;
  layout.kind = static_cast<CollectiveKind>(v[0]);
  layout.argument = v[1];
  layout.dtype = static_cast<at::ScalarType>(v[2]);
  for (std::int64_t d = 0; d < std::min(v[3], detail::layout_max_dims); ++d) layout.shape.push_back(v[4 + d]);
  if (v[3] > detail::layout_max_dims) layout.shape.resize(static_cast<std::size_t>(v[3]), -1);
  return layout;
}

ACCELERATE_INLINE void check_layouts(const std::vector<TensorLayout>& layouts, std::int64_t free_dim) {
  const TensorLayout& first = layouts.at(0);
  auto fail_with = [&](std::size_t r, const std::string& why) {
    accelerate::detail::fail(collective_name(first.kind), ": ranks disagree on what they pass (", why,
                             "): rank 0 passes ", first.describe(), " but rank ", r, " passes ",
                             layouts[r].describe(), "; every rank must call the same collectives in the "
                             "same order with tensors that match");
  };
  for (std::size_t r = 0; r < layouts.size(); ++r) {
    const TensorLayout& l = layouts[r];
    if (static_cast<std::int64_t>(l.shape.size()) > detail::layout_max_dims)
      accelerate::detail::fail(collective_name(l.kind), ": rank ", r, " passes a tensor of ", l.shape.size(),
                               " dimensions; at most ", detail::layout_max_dims, " are supported");
    if (r == 0) continue;
    if (l.kind != first.kind) fail_with(r, "a different collective");
    if (l.argument != first.argument)
      fail_with(r, first.kind == CollectiveKind::broadcast ? "a different root"
                   : first.kind == CollectiveKind::pad     ? "a different dim"
                                                           : "a different reduction");
    if (first.kind == CollectiveKind::broadcast) continue;  // receivers take the sender's tensor
    if (l.dtype != first.dtype) fail_with(r, "a different dtype");
    if (l.shape.size() != first.shape.size()) fail_with(r, "a different number of dimensions");
    for (std::size_t d = 0; d < l.shape.size(); ++d)
      if (static_cast<std::int64_t>(d) != free_dim && l.shape[d] != first.shape[d])
        fail_with(r, free_dim < 0 ? "shapes must be equal"
                                  : "only dim " + std::to_string(free_dim) + " may differ");
  }
}

}  // namespace accelerate::distributed
