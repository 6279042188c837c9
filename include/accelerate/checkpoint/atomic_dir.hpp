// AtomicDirectory: a folder that appears under its final name only once complete. Files are
// written into a hidden sibling, fsynced, and the sibling is renamed into place; a crash at
// any moment leaves either the previous folder or the new one, never a half-written one.
#pragma once

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate::checkpoint {

/// fsync of a file or folder (a folder's entries are durable only after its own fsync).
void fsync_path(const std::filesystem::path& path);

/// The hidden sibling in which `target` is assembled: ".<name>.incomplete".
std::filesystem::path staging_path(const std::filesystem::path& target);

/// Makes an empty staging folder for `target`, removing one a crashed save left behind.
std::filesystem::path begin_staging(const std::filesystem::path& target);

/// Publishes the staging folder of `target` under its final name. The staged files must be
/// fsynced already. An existing `target` is swapped out atomically (renameat2 RENAME_EXCHANGE)
/// and removed only after the new folder is in place.
void commit_staging(const std::filesystem::path& target);

}  // namespace accelerate::checkpoint

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/checkpoint/atomic_dir.ipp>
#endif
