// StateDict and the Stateful concept: how any object's training state reaches save_state.
//
// Customization points (the first that applies wins):
//   1. members `StateDict state_dict() const` and `void load_state_dict(const StateDict&)`;
//   2. a Boost.Hana adapted struct (see <accelerate/checkpoint/reflect.hpp>).
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

namespace accelerate {

/// One object's state as it is written: tensors go to a safetensors file under their keys, and
/// every other value to a JSON document. Nothing is pickled, so loading runs no code.
/// Example:
///   accelerate::StateDict s;
///   s.tensors["ema"] = ema;  s.values["step"] = 12;
struct StateDict {
  std::map<std::string, at::Tensor> tensors;
  nlohmann::json values = nlohmann::json::object();

  // Made, copied, moved and destroyed out of line: a JSON document's destruction is several
  // KiB of code that each translation unit would otherwise generate again.
  StateDict();
  StateDict(const StateDict& other);
  StateDict(StateDict&& other) noexcept;
  StateDict& operator=(const StateDict& other);
  StateDict& operator=(StateDict&& other) noexcept;
  ~StateDict();

  /// The value under `key`, or an error naming the key and what was there.
  template <class T>
  T value(const std::string& key) const;

  /// The tensor under `key`, or an error naming the key.
  const at::Tensor& tensor(const std::string& key) const;
};

/// How save_state reaches a type that is not Stateful: specialize with static
/// `StateDict save(const T&)` and `void load(T&, const StateDict&)`.
/// <accelerate/checkpoint/reflect.hpp> does so for every Boost.Hana adapted struct.
template <class T, class Enable = void>
struct checkpoint_adapter {};

/// An object that saves and restores itself through a StateDict.
template <class T>
concept Stateful = requires(T& object, const T& const_object, const StateDict& state) {
  { const_object.state_dict() } -> std::same_as<StateDict>;
  object.load_state_dict(state);
};

}  // namespace accelerate

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate {

namespace detail {

/// The value under `key` of a state's values; an error names the key when it is missing or,
/// with `natural`, when it is not a natural number (nlohmann would turn -1 into 2^64 - 1).
const nlohmann::json& state_value(const nlohmann::json& values, const std::string& key, bool natural);

/// The error of a value that does not convert to the type asked for.
[[noreturn]] void fail_state_value_type(const std::string& key, const nlohmann::json& value,
                                        const nlohmann::json::exception& error);

}  // namespace detail

template <class T>
T StateDict::value(const std::string& key) const {
  const nlohmann::json& found = detail::state_value(values, key, std::is_unsigned_v<T> && !std::is_same_v<T, bool>);
  try {
    return found.template get<T>();
  } catch (const nlohmann::json::exception& e) {
    detail::fail_state_value_type(key, found, e);
  }
}

inline const at::Tensor& StateDict::tensor(const std::string& key) const {
  const auto it = tensors.find(key);
  ACCELERATE_CHECK(it != tensors.end(), "state: tensor '", key, "' is missing");
  return it->second;
}

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/checkpoint/stateful.ipp>
#endif
