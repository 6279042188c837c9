// JsonlTracker: metrics as one JSON object per line.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/track/tracker.hpp>

namespace accelerate {

/// Writes `<dir>/<project>/config.json` and appends `{"step": s, "<name>": value, ...}` lines
/// to `<dir>/<project>/metrics.jsonl`.
/// Example:
///   acc.add_tracker(accelerate::JsonlTracker("runs"));
class JsonlTracker {
 public:
  explicit JsonlTracker(std::filesystem::path dir) : dir_(std::move(dir)) {}
  std::string name() const { return "jsonl"; }
  void start(const std::string& project, const nlohmann::json& config);
  void log(const Metrics& values, std::int64_t step);
  void finish() { out_.close(); }

 private:
  std::filesystem::path dir_;
  std::ofstream out_;
};

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/track/jsonl.ipp>
#endif
