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

namespace accelerate::checkpoint {

/// fsync of a file or folder (a folder's entries are durable only after its own fsync).
inline void fsync_path(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ACCELERATE_CHECK(fd >= 0, "checkpoint: cannot open ", path.string(), " to fsync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  ACCELERATE_CHECK(rc == 0, "checkpoint: fsync of ", path.string(), " failed: ", std::strerror(err));
}

/// The hidden sibling in which `target` is assembled: ".<name>.incomplete".
inline std::filesystem::path staging_path(const std::filesystem::path& target) {
  std::string name = ".";  // appended, not "." + ...: GCC 12 -Wstringop-overflow false positive
  name.append(target.filename().string()).append(".incomplete");
  return target.parent_path() / name;
}

/// Makes an empty staging folder for `target`, removing one a crashed save left behind.
inline std::filesystem::path begin_staging(const std::filesystem::path& target) {
  const auto staging = staging_path(target);
  std::error_code ec;
  std::filesystem::remove_all(staging, ec);
  std::filesystem::create_directories(staging);
  return staging;
}

/// Publishes the staging folder of `target` under its final name. The staged files must be
/// fsynced already. An existing `target` is swapped out atomically (renameat2 RENAME_EXCHANGE)
/// and removed only after the new folder is in place.
inline void commit_staging(const std::filesystem::path& target) {
  const auto staging = staging_path(target);
  fsync_path(staging);
  std::error_code ec;
  if (std::filesystem::exists(target)) {
#ifdef SYS_renameat2
    constexpr unsigned rename_exchange = 1u << 1;  // RENAME_EXCHANGE
    const long rc = ::syscall(SYS_renameat2, AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), rename_exchange);
    if (rc == 0) {
      fsync_path(target.parent_path().empty() ? "." : target.parent_path());
      std::filesystem::remove_all(staging, ec);  // now holds the previous folder
      return;
    }
#endif
    // Without an atomic exchange: move the old folder aside first, so one always exists.
    const auto previous = target.parent_path() / ("." + target.filename().string() + ".previous");
    std::filesystem::remove_all(previous, ec);
    std::filesystem::rename(target, previous);
    std::filesystem::rename(staging, target);
    fsync_path(target.parent_path().empty() ? "." : target.parent_path());
    std::filesystem::remove_all(previous, ec);
    return;
  }
  std::filesystem::rename(staging, target);
  fsync_path(target.parent_path().empty() ? "." : target.parent_path());
}

}  // namespace accelerate::checkpoint
