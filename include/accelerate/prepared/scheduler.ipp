// Bodies of scheduler.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/prepared/scheduler.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE StateDict step_count_state_dict(unsigned step_count) {
  StateDict s;
  s.values["step_count"] = step_count;
  return s;
}

ACCELERATE_INLINE unsigned step_count_from(const StateDict& state) { return state.value<unsigned>("step_count"); }

ACCELERATE_INLINE StateDict plateau_state_dict(const compat::PlateauState& state) {
  StateDict s;
  s.values["last_epoch"] = state.last_epoch;
  s.values["num_bad_epochs"] = state.num_bad_epochs;
  s.values["cooldown_counter"] = state.cooldown_counter;
  if (std::isfinite(state.best)) s.values["best"] = state.best;
  else s.values["best"] = std::isnan(state.best) ? "nan" : state.best > 0 ? "inf" : "-inf";
  return s;
}

ACCELERATE_INLINE compat::PlateauState plateau_state_from(const StateDict& state) {
  compat::PlateauState restored;
  restored.last_epoch = state.value<int>("last_epoch");
  const auto it = state.values.find("best");
  const std::string text = it != state.values.end() && it->is_string() ? it->get<std::string>() : "";
  if (text == "nan") restored.best = std::numeric_limits<float>::quiet_NaN();
  else if (text == "inf") restored.best = std::numeric_limits<float>::infinity();
  else if (text == "-inf") restored.best = -std::numeric_limits<float>::infinity();
  else restored.best = state.value<float>("best");
  restored.num_bad_epochs = state.value<int>("num_bad_epochs");
  restored.cooldown_counter = state.value<int>("cooldown_counter");
  return restored;
}

}  // namespace accelerate::detail
