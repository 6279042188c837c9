// Packing a nested batch into one byte tensor and a JSON layout, and back: how one process
// sends batches of any structure to the others in two messages (dispatch_batches).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/data/example.h>

#include <accelerate/data/batch.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate::data {

/// A batch as {layout, bytes}: `bytes` holds every tensor's data, one after the other, in
/// for_each_tensor order (a uint8 tensor on `device`); `layout` mirrors the batch's structure
/// with each tensor's dtype and shape, and carries non-tensor leaves (numbers, strings) by
/// value. unpack_batch<T> on another process rebuilds an equal batch.
/// Example:
///   auto [layout, bytes] = accelerate::data::pack_batch(batch, at::kCPU);
///   auto same = accelerate::data::unpack_batch<decltype(batch)>(layout, bytes);
template <class T>
std::pair<nlohmann::json, at::Tensor> pack_batch(const T& batch, const c10::Device& device);

/// Bytes of all the tensors a pack_batch() layout (or a part of one) describes.
std::int64_t packed_bytes(const nlohmann::json& layout);

/// The batch that pack_batch() described (see there); tensors are created on `bytes`' device.
/// A layout that does not match T is an accelerate::Error naming what differs.
template <class T>
T unpack_batch(const nlohmann::json& layout, const at::Tensor& bytes);

}  // namespace accelerate::data

namespace accelerate::detail {

inline at::Tensor bytes_of(const at::Tensor& t) {
  return t.detach().contiguous().reshape({-1}).view(at::kByte);
}

template <class T>
nlohmann::json layout_of(const T& value, std::vector<at::Tensor>& parts) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, at::Tensor>) {
    if (!value.defined()) return nullptr;
    if (value.numel() > 0) parts.push_back(bytes_of(value));
    return {{"dtype", static_cast<int>(value.scalar_type())}, {"shape", value.sizes().vec()}};
  } else if constexpr (is_example<U>::value) {
    nlohmann::json out = nlohmann::json::array({layout_of(value.data, parts)});
    if constexpr (!std::is_same_v<decltype(value.target), torch::data::example::NoTarget>)
      out.push_back(layout_of(value.target, parts));
    return out;
  } else if constexpr (is_vector<U>::value || is_array<U>::value) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& item : value) out.push_back(layout_of(item, parts));
    return out;
  } else if constexpr (is_tuple_like<U>::value) {
    nlohmann::json out = nlohmann::json::array();
    std::apply([&](const auto&... items) { (out.push_back(layout_of(items, parts)), ...); }, value);
    return out;
  } else if constexpr (is_string_map<U>::value) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [key, item] : value) out[key] = layout_of(item, parts);
    return out;
  } else if constexpr (std::is_arithmetic_v<U> || std::is_same_v<U, std::string>) {
    return {{"value", value}};
  } else {
    static_assert(dependent_false<U>,
                  "accelerate::data::pack_batch: this batch type is not a tensor, Example, vector, "
                  "array, tuple, pair, std::map<std::string, ...>, number or string");
  }
}

struct Unpacking {
  const at::Tensor& bytes;
  std::int64_t offset = 0;

  [[noreturn]] void mismatch(const nlohmann::json& layout, const char* expected) const {
    fail("unpack_batch: the layout ", layout.dump().substr(0, 200), " is not ", expected,
         " (every process must prepare the same batch type)");
  }

  template <class T>
  T read(const nlohmann::json& layout) {
    using U = std::remove_cvref_t<T>;
    if constexpr (std::is_same_v<U, at::Tensor>) {
      if (layout.is_null()) return {};
      if (!layout.is_object() || !layout.contains("dtype") || !layout.contains("shape")) mismatch(layout, "a tensor");
      const auto dtype = static_cast<at::ScalarType>(layout["dtype"].get<int>());
      const auto shape = layout["shape"].get<std::vector<std::int64_t>>();
      at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype).device(bytes.device()));
      const std::int64_t n = out.numel() * static_cast<std::int64_t>(out.element_size());
      ACCELERATE_CHECK(offset + n <= bytes.numel(), "unpack_batch: the tensors need more than the ", bytes.numel(),
                       " bytes received");
      if (n > 0) out.reshape({-1}).view(at::kByte).copy_(bytes.narrow(0, offset, n));
      offset += n;
      return out;
    } else if constexpr (is_example<U>::value) {
      if (!layout.is_array() || layout.empty()) mismatch(layout, "an Example");
      if constexpr (std::is_same_v<decltype(U::target), torch::data::example::NoTarget>) {
        return U(read<decltype(U::data)>(layout[0]));
      } else {
        if (layout.size() != 2) mismatch(layout, "an Example with a target");
        auto data = read<decltype(U::data)>(layout[0]);
        return U(std::move(data), read<decltype(U::target)>(layout[1]));
      }
    } else if constexpr (is_vector<U>::value) {
      if (!layout.is_array()) mismatch(layout, "a vector");
      U out;
      out.reserve(layout.size());
      for (const auto& item : layout) out.push_back(read<typename U::value_type>(item));
      return out;
    } else if constexpr (is_array<U>::value || is_tuple_like<U>::value) {
      constexpr std::size_t n = std::tuple_size_v<U>;
      if (!layout.is_array() || layout.size() != n) mismatch(layout, "a tuple or array of this size");
      // Braced initialisation reads the elements left to right, in the order they were packed.
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return U{read<std::tuple_element_t<I, U>>(layout[I])...};
      }(std::make_index_sequence<n>{});
    } else if constexpr (is_string_map<U>::value) {
      if (!layout.is_object()) mismatch(layout, "a map");
      U out;
      for (const auto& [key, item] : layout.items()) out.emplace(key, read<typename U::mapped_type>(item));
      return out;
    } else {
      if (!layout.is_object() || !layout.contains("value")) mismatch(layout, "a number or string");
      return layout["value"].get<U>();
    }
  }
};

}  // namespace accelerate::detail

namespace accelerate::data {

template <class T>
std::pair<nlohmann::json, at::Tensor> pack_batch(const T& batch, const c10::Device& device) {
  std::vector<at::Tensor> parts;
  nlohmann::json layout = detail::layout_of(batch, parts);
  for (auto& part : parts) part = part.to(device);
  at::Tensor bytes = parts.empty() ? at::empty({0}, at::TensorOptions().dtype(at::kByte).device(device)) : at::cat(parts);
  return {std::move(layout), bytes};
}

template <class T>
T unpack_batch(const nlohmann::json& layout, const at::Tensor& bytes) {
  ACCELERATE_CHECK(bytes.scalar_type() == at::kByte && bytes.dim() == 1,
                   "unpack_batch: expected a 1-d uint8 tensor of bytes, got ", bytes.scalar_type(), " of shape ",
                   bytes.sizes());
  detail::Unpacking reader{bytes};
  T out = reader.read<T>(layout);
  ACCELERATE_CHECK(reader.offset == bytes.numel(), "unpack_batch: ", bytes.numel() - reader.offset,
                   " of the ", bytes.numel(), " bytes received belong to no tensor of the layout");
  return out;
}

}  // namespace accelerate::data

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/data/batch_layout.ipp>
#endif
