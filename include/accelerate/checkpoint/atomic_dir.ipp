// Bodies of atomic_dir.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/checkpoint/atomic_dir.hpp>

namespace accelerate::checkpoint {

ACCELERATE_INLINE void fsync_path(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ACCELERATE_CHECK(fd >= 0, "checkpoint: cannot open ", path.string(), " to fsync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  ACCELERATE_CHECK(rc == 0, "checkpoint: fsync of ", path.string(), " failed: ", std::strerror(err));
}

ACCELERATE_INLINE std::filesystem::path staging_path(const std::filesystem::path& target) {
  std::string name = ".";  // appended, not "." + ...: GCC 12 -Wstringop-overflow false positive
  name.append(target.filename().string()).append(".incomplete");
  return target.parent_path() / name;
}

ACCELERATE_INLINE std::filesystem::path begin_staging(const std::filesystem::path& target) {
  const auto staging = staging_path(target);
  std::error_code ec;
  std::filesystem::remove_all(staging, ec);
  std::filesystem::create_directories(staging);
  return staging;
}

ACCELERATE_INLINE void commit_staging(const std::filesystem::path& target) {
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
