// Traits that recognise the standard containers the library walks: nested batches of tensors
// (data/batch.hpp) and the members of a checkpointed struct (checkpoint/reflect.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace accelerate::detail {

template <class T> struct is_vector : std::false_type {};
template <class T, class A> struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T> struct is_array : std::false_type {};
template <class T, std::size_t N> struct is_array<std::array<T, N>> : std::true_type {};
template <class T> struct is_tuple_like : std::false_type {};
template <class... T> struct is_tuple_like<std::tuple<T...>> : std::true_type {};
template <class A, class B> struct is_tuple_like<std::pair<A, B>> : std::true_type {};
/// A std::map keyed by std::string (a JSON object, a named group of tensors).
template <class T> struct is_string_map : std::false_type {};
template <class V, class C, class A> struct is_string_map<std::map<std::string, V, C, A>> : std::true_type {};
template <class T> struct is_optional : std::false_type {};
template <class T> struct is_optional<std::optional<T>> : std::true_type {};

}  // namespace accelerate::detail
