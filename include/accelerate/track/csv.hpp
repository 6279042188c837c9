// CsvTracker: metrics as step,name,value rows.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/track/tracker.hpp>

namespace accelerate {

/// Appends `step,name,value` rows (one per metric) to `<dir>/<project>/metrics.csv`, so any
/// spreadsheet or pandas.read_csv reads it whatever metrics each call logs.
class CsvTracker {
 public:
  explicit CsvTracker(std::filesystem::path dir) : dir_(std::move(dir)) {}
  std::string name() const { return "csv"; }
  void start(const std::string& project, const nlohmann::json& config);
  void log(const Metrics& values, std::int64_t step);
  void finish() { out_.close(); }

 private:
  std::filesystem::path dir_;
  std::ofstream out_;
};

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/track/csv.ipp>
#endif
