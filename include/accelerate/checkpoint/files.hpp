// Opening files that come from outside: what a path is (following symbolic links, a loop
// reported as such), and opening it for reading without blocking on a FIFO or a device.
// Every problem is an accelerate::Error naming the file.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/Parallel.h>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate::checkpoint {

/// An open file descriptor, closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int value) : fd(value) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

/// What a path names once symbolic links are followed.
enum class PathKind { missing, regular, directory, other };

/// The kind of `path`; a symbolic-link loop or an unreadable path is an error naming it and
/// `who` (std::filesystem would throw its own filesystem_error instead).
PathKind path_kind(const std::filesystem::path& path, const char* who);

/// Whether `path` exists (as anything); errors as path_kind.
inline bool path_exists(const std::filesystem::path& path, const char* who) {
  return path_kind(path, who) != PathKind::missing;
}

/// Opens `path` for reading, refusing at once anything but a regular file: a FIFO, socket or
/// device is never waited on (O_NONBLOCK until fstat has seen a regular file).
int open_regular_file(const std::filesystem::path& path, const char* who);

/// The whole content of a regular file; errors name the file.
std::string read_regular_file(const std::filesystem::path& path, const char* who);

/// A 64-bit checksum of a byte stream, fed in pieces: four multiply-rotate lanes over 8-byte
/// words, so it runs at memory speed (a checkpoint is hashed as it is saved and again before it
/// is loaded). It detects a file swapped in or damaged; it is no defence against an attacker.
class Checksum {
 public:
  void update(const void* data, std::size_t size);

  /// The checksum as 16 hexadecimal digits.
  std::string hex() const;

  /// The checksum as a number.
  std::uint64_t digest() const;

 private:
  static constexpr std::uint64_t k1 = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio
  static constexpr std::uint64_t k2 = 0xD6E8FEB86659FD93ull;
  static constexpr std::uint64_t k3 = 0xA0761D6478BD642Full;
  static std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  void mix_block(const unsigned char* p);

  std::uint64_t lanes_[4] = {k1, k2, k3, k1 ^ k2};
  unsigned char block_[32] = {};
  std::size_t pending_ = 0;
  std::uint64_t length_ = 0;
};

/// The checksum of a whole regular file, as 16 hexadecimal digits: the Checksum of the
/// digests of its 8 MiB chunks, which are hashed in parallel straight from a mapping of the
/// file (no copy), so verifying a checkpoint costs a fraction of reading it. Errors name the file.
std::string file_checksum(const std::filesystem::path& path, const char* who);

}  // namespace accelerate::checkpoint

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/checkpoint/files.ipp>
#endif
