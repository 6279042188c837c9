// ProjectConfiguration: where automatic checkpoints live, how many are kept, and which one is
// the latest complete one.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <accelerate/detail/linkage.hpp>

namespace accelerate {

/// Accelerate's ProjectConfiguration. With automatic naming, save_state() writes
/// `project_dir/checkpoints/checkpoint_<iteration>` and load_state() with no argument reads the
/// highest-numbered complete one.
/// Example:
///   accelerate::ProjectConfiguration{.project_dir = "runs/a", .automatic_checkpoint_naming = true, .total_limit = 3}
struct ProjectConfiguration {
  std::filesystem::path project_dir;
  bool automatic_checkpoint_naming = false;
  /// Keep at most this many checkpoints (the oldest are removed); unset keeps all.
  std::optional<std::size_t> total_limit;
  /// Number of the next automatic checkpoint. After load_state() it continues after the loaded
  /// one (Accelerate leaves it unchanged, so the next save collides; see docs/checkpointing.md).
  std::size_t iteration = 0;
};

namespace checkpoint {

/// Name of the file whose presence marks a checkpoint folder as complete; written last.
inline constexpr std::string_view manifest_name = "accelerate_state.json";

/// The number in a folder named `checkpoint_<n>`, or nullopt for any other name (temporary
/// folders, user files).
std::optional<std::size_t> checkpoint_number(std::string_view name);

/// Complete checkpoints under `checkpoints_dir` (named checkpoint_<n> and holding a manifest),
/// sorted by number, oldest first.
std::vector<std::pair<std::size_t, std::filesystem::path>> list_checkpoints(
    const std::filesystem::path& checkpoints_dir);

}  // namespace checkpoint
}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/checkpoint/project.ipp>
#endif
