// JsonlTracker: metrics as one JSON object per line.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include <accelerate/detail/check.hpp>
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
  void start(const std::string& project, const nlohmann::json& config) {
    const auto folder = dir_ / project;
    std::filesystem::create_directories(folder);
    std::ofstream(folder / "config.json") << config.dump(2) << '\n';
    out_.open(folder / "metrics.jsonl", std::ios::app);
    ACCELERATE_CHECK(out_.good(), "JsonlTracker: cannot write ", (folder / "metrics.jsonl").string());
  }
  void log(const Metrics& values, std::int64_t step) {
    nlohmann::json line = values;
    line["step"] = step;
    out_ << line.dump() << '\n' << std::flush;
  }
  void finish() { out_.close(); }

 private:
  std::filesystem::path dir_;
  std::ofstream out_;
};

}  // namespace accelerate
