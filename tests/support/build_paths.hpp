// Paths the build gives the tests — programs it built (launch_probe, reliability_trainer), the
// project's Python and the interoperability script — read at run time from
// accelerate_test_paths.txt beside the test executable (or the environment variable of the same
// name), not compiled in: an absolute path of the checkout in a compile definition would keep
// ccache from sharing objects between two checkouts (CI's clone and a developer's tree).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>

namespace accelerate::testing {

/// The configured path named `name` (for example "ACCELERATE_TEST_PYTHON"); valid for the
/// whole run.
inline const char* build_path(const std::string& name) {
  static std::map<std::string, std::string> known;
  if (auto it = known.find(name); it != known.end()) return it->second.c_str();
  std::string value;
  if (const char* from_environment = std::getenv(name.c_str())) {
    value = from_environment;
  } else {
    const auto file = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "accelerate_test_paths.txt";
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);)
      if (line.rfind(name + "=", 0) == 0) value = line.substr(name.size() + 1);
    if (value.empty()) throw std::runtime_error(file.string() + " does not name " + name + " (re-run CMake)");
  }
  return known.emplace(name, value).first->second.c_str();
}

}  // namespace accelerate::testing

#define ACCELERATE_TEST_PYTHON (::accelerate::testing::build_path("ACCELERATE_TEST_PYTHON"))
#define ACCELERATE_INTEROP_SCRIPT (::accelerate::testing::build_path("ACCELERATE_INTEROP_SCRIPT"))
#define ACCELERATE_LAUNCH_PROBE (::accelerate::testing::build_path("ACCELERATE_LAUNCH_PROBE"))
#define ACCELERATE_TRAINER (::accelerate::testing::build_path("ACCELERATE_TRAINER"))
#define ACCELERATE_BASELINE_DIR (::accelerate::testing::build_path("ACCELERATE_BASELINE_DIR"))
