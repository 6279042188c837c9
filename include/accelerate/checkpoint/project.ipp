// Bodies of project.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/checkpoint/project.hpp>

namespace accelerate::checkpoint {

ACCELERATE_INLINE std::optional<std::size_t> checkpoint_number(std::string_view name) {
  constexpr std::string_view prefix = "checkpoint_";
  if (name.substr(0, prefix.size()) != prefix || name.size() == prefix.size()) return std::nullopt;
  std::size_t value = 0;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size();
  const auto [end, ec] = std::from_chars(first, last, value);
  if (ec != std::errc() || end != last) return std::nullopt;
  return value;
}

ACCELERATE_INLINE std::vector<std::pair<std::size_t, std::filesystem::path>> list_checkpoints(
    const std::filesystem::path& checkpoints_dir) {
  std::vector<std::pair<std::size_t, std::filesystem::path>> found;
  std::error_code ec;
  if (!std::filesystem::is_directory(checkpoints_dir, ec)) return found;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints_dir, ec)) {
    const auto number = checkpoint_number(entry.path().filename().string());
    if (number && std::filesystem::is_regular_file(entry.path() / manifest_name, ec)) {
      found.emplace_back(*number, entry.path());
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace accelerate::checkpoint
