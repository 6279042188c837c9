// Nested batches: tensors inside Examples, vectors, arrays, tuples, pairs and string-keyed maps.
// One recursion serves moving batches to a device, collating samples and the collectives.
//
// Customization point: a batch type is "nested" when it is one of the containers below; any
// other type reaching these functions is a compile error naming it.
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/data/example.h>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/diagnostics.hpp>
#include <accelerate/detail/type_traits.hpp>

namespace accelerate::detail {
template <class T> struct is_example : std::false_type {};
template <class D, class T> struct is_example<torch::data::Example<D, T>> : std::true_type {};
}  // namespace accelerate::detail

namespace accelerate::data {

/// Whether T is a tensor or a container this header can recurse into.
template <class T>
inline constexpr bool is_nested_v = [] {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, at::Tensor>) return true;
  else if constexpr (detail::is_example<U>::value) return true;
  else if constexpr (detail::is_vector<U>::value || detail::is_array<U>::value) return true;
  else if constexpr (detail::is_tuple_like<U>::value) return true;
  else if constexpr (detail::is_string_map<U>::value) return true;
  else return false;
}();

/// Whether every leaf of T is a tensor (or an Example's NoTarget): what the tensor collectives
/// can communicate. A number or a string inside would come back as this rank's own value.
template <class T>
inline constexpr bool tensors_only_v = [] {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, at::Tensor>) {
    return true;
  } else if constexpr (detail::is_example<U>::value) {
    if constexpr (std::is_same_v<decltype(U::target), torch::data::example::NoTarget>) {
      return tensors_only_v<decltype(U::data)>;
    } else {
      return tensors_only_v<decltype(U::data)> && tensors_only_v<decltype(U::target)>;
    }
  } else if constexpr (detail::is_vector<U>::value || detail::is_array<U>::value) {
    return tensors_only_v<typename U::value_type>;
  } else if constexpr (detail::is_tuple_like<U>::value) {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (tensors_only_v<std::tuple_element_t<I, U>> && ...);
    }(std::make_index_sequence<std::tuple_size_v<U>>{});
  } else if constexpr (detail::is_string_map<U>::value) {
    return tensors_only_v<typename U::mapped_type>;
  } else {
    return false;
  }
}();

/// Returns a copy of `value` in which every tensor `t` became `fn(t)`. The structure (and
/// torch::data::NoTarget targets) is preserved.
/// Example:
///   auto on_gpu = accelerate::data::map_tensors(batch, [](const at::Tensor& t) { return t.cuda(); });
template <class T, class Fn>
std::remove_cvref_t<T> map_tensors(const T& value, Fn&& fn) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, at::Tensor>) {
    return fn(value);
  } else if constexpr (detail::is_example<U>::value) {
    if constexpr (std::is_same_v<decltype(value.target), torch::data::example::NoTarget>) {
      return U(map_tensors(value.data, fn));
    } else {
      return U(map_tensors(value.data, fn), map_tensors(value.target, fn));
    }
  } else if constexpr (detail::is_vector<U>::value) {
    U out;
    out.reserve(value.size());
    for (const auto& item : value) out.push_back(map_tensors(item, fn));
    return out;
  } else if constexpr (detail::is_array<U>::value || detail::is_tuple_like<U>::value) {
    return std::apply([&](const auto&... items) { return U{map_tensors(items, fn)...}; }, value);
  } else if constexpr (detail::is_string_map<U>::value) {
    U out;
    for (const auto& [key, item] : value) out.emplace(key, map_tensors(item, fn));
    return out;
  } else if constexpr (std::is_arithmetic_v<U> || std::is_same_v<U, std::string> ||
                       std::is_same_v<U, torch::data::example::NoTarget>) {
    return value;  // non-tensor leaves travel unchanged
  } else {
    static_assert(detail::dependent_false<U>,
                  "accelerate::data: this batch type is not a tensor, Example, vector, array, "
                  "tuple, pair or std::map<std::string, ...>");
  }
}

/// Calls `fn(t)` for every tensor of `value`, depth first, in a fixed order.
template <class T, class Fn>
void for_each_tensor(const T& value, Fn&& fn) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, at::Tensor>) {
    fn(value);
  } else if constexpr (detail::is_example<U>::value) {
    for_each_tensor(value.data, fn);
    if constexpr (!std::is_same_v<decltype(value.target), torch::data::example::NoTarget>) {
      for_each_tensor(value.target, fn);
    }
  } else if constexpr (detail::is_vector<U>::value || detail::is_array<U>::value) {
    for (const auto& item : value) for_each_tensor(item, fn);
  } else if constexpr (detail::is_tuple_like<U>::value) {
    std::apply([&](const auto&... items) { (for_each_tensor(items, fn), ...); }, value);
  } else if constexpr (detail::is_string_map<U>::value) {
    for (const auto& [key, item] : value) for_each_tensor(item, fn);
  }
}

/// Moves every tensor of a batch to `device`. On CUDA the host tensors are pinned first so the
/// copy can be asynchronous (`non_blocking`).
template <class T>
std::remove_cvref_t<T> to_device(const T& batch, const c10::Device& device,
                                 bool non_blocking = false) {
  return map_tensors(batch, [&](const at::Tensor& t) {
    if (!t.defined() || t.device() == device) return t;
    if (non_blocking && device.is_cuda() && t.is_cpu()) {
      return t.pin_memory().to(device, /*non_blocking=*/true);
    }
    return t.to(device);
  });
}

/// Makes one batch from samples by stacking each tensor position along a new dimension 0
/// (the default collate of torch.utils.data). All samples must have the same structure.
template <class T>
T collate(const std::vector<T>& samples) {
  ACCELERATE_CHECK(!samples.empty(), "accelerate::data::collate: no samples to collate");
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return at::stack(samples);
  } else if constexpr (detail::is_example<T>::value) {
    using Data = decltype(samples.front().data);
    using Target = decltype(samples.front().target);
    std::vector<Data> data;
    data.reserve(samples.size());
    for (const auto& s : samples) data.push_back(s.data);
    if constexpr (std::is_same_v<Target, torch::data::example::NoTarget>) {
      return T(collate(data));
    } else {
      std::vector<Target> target;
      target.reserve(samples.size());
      for (const auto& s : samples) target.push_back(s.target);
      return T(collate(data), collate(target));
    }
  } else if constexpr (detail::is_tuple_like<T>::value || detail::is_array<T>::value) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return T{collate([&] {
        std::vector<std::remove_cvref_t<std::tuple_element_t<I, T>>> column;
        column.reserve(samples.size());
        for (const auto& s : samples) column.push_back(std::get<I>(s));
        return column;
      }())...};
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (detail::is_string_map<T>::value) {
    T out;
    for (const auto& [key, unused] : samples.front()) {
      std::vector<typename T::mapped_type> column;
      column.reserve(samples.size());
      for (const auto& s : samples) {
        auto it = s.find(key);
        ACCELERATE_CHECK(it != s.end(), "accelerate::data::collate: key '", key,
                         "' is missing from a sample");
        column.push_back(it->second);
      }
      out.emplace(key, collate(column));
    }
    return out;
  } else {
    static_assert(detail::dependent_false<T>,
                  "accelerate::data::collate: this sample type cannot be stacked; give the dataset "
                  "a get_batch() that returns whole batches");
  }
}

/// Number of rows (dimension 0) of the first tensor of a batch; 0 for a batch with no tensor.
template <class T>
int64_t batch_rows(const T& batch) {
  int64_t rows = -1;
  for_each_tensor(batch, [&](const at::Tensor& t) {
    if (rows < 0 && t.defined()) rows = t.dim() == 0 ? 1 : t.size(0);
  });
  return rows < 0 ? 0 : rows;
}

}  // namespace accelerate::data
