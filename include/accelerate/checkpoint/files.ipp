// Bodies of files.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/checkpoint/files.hpp>

namespace accelerate::checkpoint {

ACCELERATE_INLINE PathKind path_kind(const std::filesystem::path& path, const char* who) {
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

ACCELERATE_INLINE int open_regular_file(const std::filesystem::path& path, const char* who) {
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

ACCELERATE_INLINE std::string read_regular_file(const std::filesystem::path& path, const char* who) {
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

ACCELERATE_INLINE void Checksum::update(const void* data, std::size_t size) {
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

ACCELERATE_INLINE std::string Checksum::hex() const {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(digest()));
  return out;
}

ACCELERATE_INLINE std::uint64_t Checksum::digest() const {
  std::uint64_t h = length_ * k1;
  for (const auto lane : lanes_) h = rotl(h ^ (lane * k2), 27) * k1 + k3;
  for (std::size_t i = 0; i < pending_; ++i) h = rotl(h ^ (block_[i] * k3), 11) * k1;
  h ^= h >> 33;
  h *= k2;
  h ^= h >> 29;
  return h;
}

ACCELERATE_INLINE void Checksum::mix_block(const unsigned char* p) {
  for (std::size_t i = 0; i < 4; ++i) {
    std::uint64_t word;
    std::memcpy(&word, p + 8 * i, 8);
    lanes_[i] = rotl(lanes_[i] + word * k2, 31) * k1;
  }
}

ACCELERATE_INLINE std::string file_checksum(const std::filesystem::path& path, const char* who) {
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
