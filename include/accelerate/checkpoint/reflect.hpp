// Checkpointing of plain structs through Boost.Hana: a struct adapted with
// BOOST_HANA_ADAPT_STRUCT (or defined with BOOST_HANA_DEFINE_STRUCT) is saved member by
// member, its encoding derived at compile time. The only Boost.Hana include of the library.
//
// Customization point: specialize accelerate::checkpoint_adapter<T> (checkpoint/stateful.hpp)
// for a type that is neither Stateful nor a Hana struct.
#pragma once

#include <boost/hana/accessors.hpp>
#include <boost/hana/adapt_struct.hpp>  // BOOST_HANA_ADAPT_STRUCT, for users of this header
#include <boost/hana/at_key.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/concept/struct.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/keys.hpp>
#include <boost/hana/string.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <accelerate/detail/type_traits.hpp>
#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/detail/check.hpp>

namespace accelerate {

/// A Boost.Hana adapted struct.
template <class T>
concept HanaStruct = boost::hana::Struct<T>::value;

namespace checkpoint {

}  // namespace checkpoint

namespace detail {

/// Never defined: names the struct, the member (as a hana::string of its characters) and the
/// member's type when that type has no checkpoint encoding.
template <class Struct, class MemberName, class MemberType>
struct no_checkpoint_encoding;


/// Whether a member of type T can be checkpointed: arithmetic, std::string, at::Tensor, and
/// std::vector / std::map<std::string, _> / std::optional of those, and nested Hana structs.
template <class T>
constexpr bool encodable() {
  if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, std::string> || std::is_same_v<T, at::Tensor>)
    return true;
  else if constexpr (is_vector<T>::value || is_optional<T>::value) return encodable<typename T::value_type>();
  else if constexpr (is_string_map<T>::value) return encodable<typename T::mapped_type>();
  else if constexpr (HanaStruct<T>) {
    bool all = true;
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto pair) {
      using Member = std::remove_cvref_t<decltype(boost::hana::second(pair)(std::declval<T&>()))>;
      all = all && encodable<Member>();
    });
    return all;
  } else return false;
}

// Tensors live in the StateDict's safetensors part under their path; the JSON keeps a
// {"$tensor": path} reference (or null for an undefined tensor) in their place.
template <class T>
nlohmann::json encode(const T& value, const std::string& path, StateDict& out) {
  if constexpr (std::is_same_v<T, at::Tensor>) {
    if (!value.defined()) return nullptr;
    out.tensors[path] = value.detach();
    return {{"$tensor", path}};
  } else if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, std::string>) {
    return value;
  } else if constexpr (is_optional<T>::value) {
    return value ? encode(*value, path, out) : nlohmann::json(nullptr);
  } else if constexpr (is_vector<T>::value) {
    nlohmann::json array = nlohmann::json::array();
    for (std::size_t i = 0; i < value.size(); ++i) array.push_back(encode(value[i], path + "." + std::to_string(i), out));
    return array;
  } else if constexpr (is_string_map<T>::value) {
    nlohmann::json object = nlohmann::json::object();
    for (const auto& [key, item] : value) object[key] = encode(item, path + "." + key, out);
    return object;
  } else {
    nlohmann::json object = nlohmann::json::object();
    boost::hana::for_each(boost::hana::keys(value), [&](auto key) {
      const std::string name = boost::hana::to<const char*>(key);
      object[name] = encode(boost::hana::at_key(value, key), path.empty() ? name : path + "." + name, out);
    });
    return object;
  }
}

template <class T>
void decode(T& value, const nlohmann::json& json, const std::string& path, const StateDict& in) {
  try {
    if constexpr (std::is_same_v<T, at::Tensor>) {
      if (json.is_null()) {
        value = at::Tensor();
        return;
      }
      const auto& saved = in.tensor(json.at("$tensor").get<std::string>());
      value = value.defined() ? saved.to(value.device(), saved.scalar_type(), false, true) : saved.clone();
    } else if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, std::string>) {
      value = json.get<T>();
    } else if constexpr (is_optional<T>::value) {
      if (json.is_null()) {
        value.reset();
      } else {
        typename T::value_type item{};
        decode(item, json, path, in);
        value = std::move(item);
      }
    } else if constexpr (is_vector<T>::value) {
      value.clear();
      for (std::size_t i = 0; i < json.size(); ++i) {
        typename T::value_type item{};
        decode(item, json.at(i), path + "." + std::to_string(i), in);
        value.push_back(std::move(item));
      }
    } else if constexpr (is_string_map<T>::value) {
      value.clear();
      for (const auto& [key, item_json] : json.items()) {
        typename T::mapped_type item{};
        decode(item, item_json, path + "." + key, in);
        value.emplace(key, std::move(item));
      }
    } else {
      boost::hana::for_each(boost::hana::keys(value), [&](auto key) {
        const std::string name = boost::hana::to<const char*>(key);
        const std::string member = path.empty() ? name : path + "." + name;
        ACCELERATE_CHECK(json.contains(name), "state: member '", member, "' is missing");
        decode(boost::hana::at_key(value, key), json.at(name), member, in);
      });
    }
  } catch (const nlohmann::json::exception& e) {
    detail::fail("state: member '", path, "' does not match its saved value (", e.what(), ")");
  }
}

/// Names the first member of T without an encoding (the compile error carries the struct,
/// member name and type).
template <class T>
constexpr void require_encodable() {
  boost::hana::for_each(boost::hana::accessors<T>(), [](auto pair) {
    using Member = std::remove_cvref_t<decltype(boost::hana::second(pair)(std::declval<T&>()))>;
    using Name = std::remove_cvref_t<decltype(boost::hana::first(pair))>;
    if constexpr (HanaStruct<Member>) {
      require_encodable<Member>();
    } else if constexpr (!encodable<Member>()) {
      static_assert(sizeof(no_checkpoint_encoding<T, Name, Member>) == 0,
                    "accelerate::checkpoint: a member of this struct has a type with no checkpoint "
                    "encoding (arithmetic, std::string, torch::Tensor, std::vector, "
                    "std::map<std::string, _>, std::optional, nested Hana structs); the struct, the "
                    "member's name and its type are named above");
    }
  });
}

}  // namespace detail

namespace checkpoint {

/// A Hana struct's state: every member under its name (nested members dotted), tensors in
/// the safetensors part.
template <HanaStruct T>
StateDict reflect_state_dict(const T& value) {
  detail::require_encodable<T>();
  StateDict out;
  out.values = detail::encode(value, "", out);
  return out;
}

/// Restores what reflect_state_dict() produced.
template <HanaStruct T>
void reflect_load_state_dict(T& value, const StateDict& state) {
  detail::require_encodable<T>();
  detail::decode(value, state.values, "", state);
}

}  // namespace checkpoint

/// Hana structs plug into register_for_checkpointing through this adapter.
template <class T>
struct checkpoint_adapter<T, std::enable_if_t<HanaStruct<T> && !Stateful<T>>> {
  static StateDict save(const T& value) { return checkpoint::reflect_state_dict(value); }
  static void load(T& value, const StateDict& state) { checkpoint::reflect_load_state_dict(value, state); }
};

}  // namespace accelerate
