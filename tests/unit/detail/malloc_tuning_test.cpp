// Tests of include/accelerate/detail/malloc_tuning.hpp: populate_pages maps a fresh buffer's
// pages without writing them (what a process's first asynchronous save relies on).
#include <accelerate/detail/malloc_tuning.hpp>

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <vector>

namespace {

// Pages of [data, data + bytes) resident in memory (mincore).
std::size_t resident_pages(void* data, std::size_t bytes) {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core((bytes + page - 1) / page);
  if (::mincore(data, bytes, in_core.data()) != 0) return 0;
  std::size_t resident = 0;
  for (const unsigned char flags : in_core) resident += flags & 1;
  return resident;
}

// Whether this kernel populates pages on request (madvise(MADV_POPULATE_WRITE), Linux 5.14).
bool kernel_populates() {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  void* probe = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  const bool works = probe != MAP_FAILED && ::madvise(probe, page, 23 /* MADV_POPULATE_WRITE */) == 0;
  if (probe != MAP_FAILED) ::munmap(probe, page);
  return works;
}

TEST(PopulatePages, MapsEveryPageOfAFreshBufferWithoutWritingIt) {
  if (!kernel_populates()) GTEST_SKIP() << "this kernel has no madvise(MADV_POPULATE_WRITE) (Linux 5.14)";
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t bytes = 256 * page;
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(data, MAP_FAILED);
  ASSERT_EQ(resident_pages(data, bytes), 0u) << "a fresh anonymous mapping has no page yet";
  // A buffer that starts and ends inside pages: the pages around it are mapped as well.
  accelerate::detail::populate_pages(static_cast<char*>(data) + 100, bytes - 200);
  EXPECT_EQ(resident_pages(data, bytes), bytes / page);
  const auto* bytes_seen = static_cast<const unsigned char*>(data);
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < bytes; ++i) nonzero += bytes_seen[i] != 0;
  EXPECT_EQ(nonzero, 0u) << "nothing is written";
  ::munmap(data, bytes);
}

}  // namespace
