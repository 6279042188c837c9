// Bodies of trackers.hpp (see detail/linkage.hpp).
#pragma once

#include <algorithm>

#include <accelerate/track/csv.hpp>
#include <accelerate/track/jsonl.hpp>
#include <accelerate/track/tensorboard.hpp>
#include <accelerate/track/trackers.hpp>

namespace accelerate {

ACCELERATE_INLINE void Trackers::start(const std::string& project, const nlohmann::json& config,
                                       const TrackingOptions& options, const std::filesystem::path& project_dir) {
  const std::filesystem::path dir = !options.logging_dir.empty() ? options.logging_dir
                                    : !project_dir.empty()       ? project_dir
                                                                 : std::filesystem::path(".");
  const auto wants = [&](const char* name) {
    const auto& names = options.log_with;
    return std::find(names.begin(), names.end(), name) != names.end() ||
           std::find(names.begin(), names.end(), "all") != names.end();
  };
  if (wants("jsonl")) trackers_.emplace_back(JsonlTracker(dir));
  if (wants("csv")) trackers_.emplace_back(CsvTracker(dir));
  if (wants("tensorboard")) trackers_.emplace_back(TensorBoardTracker(dir));
  for (auto& tracker : trackers_) tracker.start(project, config);
}

ACCELERATE_INLINE void Trackers::log(const Metrics& values, std::int64_t step) {
  for (auto& tracker : trackers_) tracker.log(values, step);
}

ACCELERATE_INLINE void Trackers::finish() {
  for (auto& tracker : trackers_) tracker.finish();
  trackers_.clear();
}

}  // namespace accelerate
