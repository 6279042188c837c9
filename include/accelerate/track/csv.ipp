// Bodies of csv.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/track/csv.hpp>

namespace accelerate {

ACCELERATE_INLINE void CsvTracker::start(const std::string& project, const nlohmann::json& config) {
  const auto folder = dir_ / project;
  std::filesystem::create_directories(folder);
  std::ofstream(folder / "config.json") << config.dump(2) << '\n';
  const auto path = folder / "metrics.csv";
  const bool fresh = !std::filesystem::exists(path) || std::filesystem::file_size(path) == 0;
  out_.open(path, std::ios::app);
  ACCELERATE_CHECK(out_.good(), "CsvTracker: cannot write ", path.string());
  if (fresh) out_ << "step,name,value\n";
}

ACCELERATE_INLINE void CsvTracker::log(const Metrics& values, std::int64_t step) {
  for (const auto& [key, value] : values) {
    // RFC 4180: quote names holding commas or quotes.
    std::string name = key;
    if (name.find_first_of(",\"\n") != std::string::npos) {
      std::string quoted = "\"";
      for (const char c : name) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
      name = quoted + "\"";
    }
    char number[32];
    std::snprintf(number, sizeof number, "%.17g", value);
    out_ << step << ',' << name << ',' << number << '\n';
  }
  out_.flush();
}

}  // namespace accelerate
