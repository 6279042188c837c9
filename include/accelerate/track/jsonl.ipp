// Bodies of jsonl.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/track/jsonl.hpp>

namespace accelerate {

ACCELERATE_INLINE void JsonlTracker::start(const std::string& project, const nlohmann::json& config) {
  const auto folder = dir_ / project;
  std::filesystem::create_directories(folder);
  std::ofstream(folder / "config.json") << config.dump(2) << '\n';
  out_.open(folder / "metrics.jsonl", std::ios::app);
  ACCELERATE_CHECK(out_.good(), "JsonlTracker: cannot write ", (folder / "metrics.jsonl").string());
}

ACCELERATE_INLINE void JsonlTracker::log(const Metrics& values, std::int64_t step) {
  nlohmann::json line = values;
  line["step"] = step;
  out_ << line.dump() << '\n' << std::flush;
}

}  // namespace accelerate
