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
inline PathKind path_kind(const std::filesystem::path& path, const char* who) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return PathKind::missing;
    detail::fail(who, ": ", path.string(), ": ",
                 err == ELOOP ? "too many levels of symbolic links (a symlink loop?)" : std::strerror(err));
  }
  if (S_ISREG(st.st_mode)) return PathKind::regular;
  if (S_ISDIR(st.st_mode)) return PathKind::directory;
  return PathKind::other;
}

/// Whether `path` exists (as anything); errors as path_kind.
inline bool path_exists(const std::filesystem::path& path, const char* who) {
  return path_kind(path, who) != PathKind::missing;
}

/// Opens `path` for reading, refusing at once anything but a regular file: a FIFO, socket or
/// device is never waited on (O_NONBLOCK until fstat has seen a regular file).
inline int open_regular_file(const std::filesystem::path& path, const char* who) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    detail::fail(who, ": cannot open ", path.string(), ": ",
                 err == ELOOP ? "too many levels of symbolic links (a symlink loop?)" : std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    detail::fail(who, ": ", path.string(), " is not a regular file (a FIFO, socket or device is refused)");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

/// The whole content of a regular file; errors name the file.
inline std::string read_regular_file(const std::filesystem::path& path, const char* who) {
  Fd file(open_regular_file(path, who));
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(file.fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    ACCELERATE_CHECK(n >= 0, who, ": reading ", path.string(), " failed: ", std::strerror(errno));
    if (n == 0) break;
    out.append(buffer, static_cast<std::size_t>(n));
  }
  return out;
}

/// A 64-bit checksum of a byte stream, fed in pieces: four multiply-rotate lanes over 8-byte
/// words, so it runs at memory speed (a checkpoint is hashed as it is saved and again before it
/// is loaded). It detects a file swapped in or damaged; it is no defence against an attacker.
class Checksum {
 public:
  void update(const void* data, std::size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    length_ += size;
    if (pending_ > 0) {  // complete a block left over from the previous piece
      const std::size_t take = std::min(size, sizeof block_ - pending_);
      std::memcpy(block_ + pending_, p, take);
      pending_ += take;
      p += take;
      size -= take;
      if (pending_ < sizeof block_) return;
      mix_block(block_);
      pending_ = 0;
    }
    for (; size >= sizeof block_; p += sizeof block_, size -= sizeof block_) mix_block(p);
    std::memcpy(block_, p, size);
    pending_ = size;
  }

  /// The checksum as 16 hexadecimal digits.
  std::string hex() const {
    char out[17];
    std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(digest()));
    return out;
  }

  /// The checksum as a number.
  std::uint64_t digest() const {
    std::uint64_t h = length_ * k1;
    for (const auto lane : lanes_) h = rotl(h ^ (lane * k2), 27) * k1 + k3;
    for (std::size_t i = 0; i < pending_; ++i) h = rotl(h ^ (block_[i] * k3), 11) * k1;
    h ^= h >> 33;
    h *= k2;
    h ^= h >> 29;
    return h;
  }

 private:
  static constexpr std::uint64_t k1 = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio
  static constexpr std::uint64_t k2 = 0xD6E8FEB86659FD93ull;
  static constexpr std::uint64_t k3 = 0xA0761D6478BD642Full;
  static std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  void mix_block(const unsigned char* p) {
    for (std::size_t i = 0; i < 4; ++i) {
      std::uint64_t word;
      std::memcpy(&word, p + 8 * i, 8);
      lanes_[i] = rotl(lanes_[i] + word * k2, 31) * k1;
    }
  }

  std::uint64_t lanes_[4] = {k1, k2, k3, k1 ^ k2};
  unsigned char block_[32] = {};
  std::size_t pending_ = 0;
  std::uint64_t length_ = 0;
};

/// The checksum of a whole regular file, as 16 hexadecimal digits: the Checksum of the
/// digests of its 8 MiB chunks, which are hashed in parallel straight from a mapping of the
/// file (no copy), so verifying a checkpoint costs a fraction of reading it. Errors name the file.
inline std::string file_checksum(const std::filesystem::path& path, const char* who) {
  constexpr std::size_t chunk = std::size_t{8} << 20;
  Fd file(open_regular_file(path, who));
  struct stat st {};
  ACCELERATE_CHECK(::fstat(file.fd, &st) == 0, who, ": cannot stat ", path.string(), ": ", std::strerror(errno));
  const auto size = static_cast<std::size_t>(st.st_size);
  const std::size_t chunks = (size + chunk - 1) / chunk;
  std::vector<std::uint64_t> digests(chunks);
  if (size > 0) {
    void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.fd, 0);
    ACCELERATE_CHECK(mapping != MAP_FAILED, who, ": cannot map ", path.string(), ": ", std::strerror(errno));
    const auto* bytes = static_cast<const unsigned char*>(mapping);
    ::madvise(mapping, size, MADV_SEQUENTIAL);
    at::parallel_for(0, static_cast<int64_t>(chunks), 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const std::size_t offset = static_cast<std::size_t>(c) * chunk;
        Checksum part;
        part.update(bytes + offset, std::min(chunk, size - offset));
        digests[static_cast<std::size_t>(c)] = part.digest();
      }
    });
    ::munmap(mapping, size);
  }
  Checksum whole;
  whole.update(digests.data(), digests.size() * sizeof(std::uint64_t));
  whole.update(&size, sizeof size);
  return whole.hex();
}

}  // namespace accelerate::checkpoint
