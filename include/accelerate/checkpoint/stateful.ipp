// Bodies of stateful.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/checkpoint/stateful.hpp>

namespace accelerate {

ACCELERATE_INLINE StateDict::StateDict() = default;
ACCELERATE_INLINE StateDict::StateDict(const StateDict& other) = default;
ACCELERATE_INLINE StateDict::StateDict(StateDict&& other) noexcept = default;
ACCELERATE_INLINE StateDict& StateDict::operator=(const StateDict& other) = default;
ACCELERATE_INLINE StateDict& StateDict::operator=(StateDict&& other) noexcept = default;
ACCELERATE_INLINE StateDict::~StateDict() = default;

}  // namespace accelerate

namespace accelerate::detail {

ACCELERATE_INLINE const nlohmann::json& state_value(const nlohmann::json& values, const std::string& key,
                                                    bool natural) {
  const auto it = values.find(key);
  ACCELERATE_CHECK(it != values.end(), "state: value '", key, "' is missing");
  ACCELERATE_CHECK(!natural || it->is_number_unsigned() || (it->is_number_integer() && it->get<std::int64_t>() >= 0),
                   "state: value '", key, "' is ", it->dump(), ", expected a natural number");
  return *it;
}

ACCELERATE_INLINE void fail_state_value_type(const std::string& key, const nlohmann::json& value,
                                             const nlohmann::json::exception& error) {
  fail("state: value '", key, "' has the wrong type (", value.type_name(), "): ", error.what());
}

}  // namespace accelerate::detail
