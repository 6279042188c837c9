// Trackers: the experiment trackers an Accelerator keeps on its main process, the built-in ones
// TrackingOptions::log_with names and the user's own, started, fed and finished together.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <accelerate/detail/linkage.hpp>
#include <accelerate/options.hpp>
#include <accelerate/track/tracker.hpp>

namespace accelerate {

/// A set of trackers (Accelerator::init_trackers, log, end_training forward to it).
/// Example:
///   accelerate::Trackers trackers;
///   trackers.start("run", {{"lr", 1e-3}}, {.log_with = {"jsonl"}, .logging_dir = "logs"}, "");
///   trackers.log({{"loss", 0.5}}, 1);
///   trackers.finish();
class Trackers {
 public:
  /// Adds a tracker of the user's, started with the built-in ones.
  template <Tracker T>
  void add(T tracker) {
    trackers_.emplace_back(std::move(tracker));
  }

  /// Adds the built-in trackers `options.log_with` names ("jsonl", "csv", "tensorboard" or
  /// "all"), writing under options.logging_dir, else `project_dir`, else the working folder,
  /// and starts every tracker, recording `config`.
  void start(const std::string& project, const nlohmann::json& config, const TrackingOptions& options,
             const std::filesystem::path& project_dir);

  /// Records scalar metrics at `step` with every tracker.
  void log(const Metrics& values, std::int64_t step);

  /// Finishes every tracker and forgets them.
  void finish();

  std::size_t size() const noexcept { return trackers_.size(); }

 private:
  std::vector<AnyTracker> trackers_;
};

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/track/trackers.ipp>
#endif
