// Bodies of malloc_tuning.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/detail/malloc_tuning.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE void retain_freed_memory() noexcept {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
#endif
}

ACCELERATE_INLINE void return_freed_memory() noexcept {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 4 << 20);
  mallopt(M_TRIM_THRESHOLD, 4 << 20);
  malloc_trim(0);  // and what an earlier setting kept
#endif
}

ACCELERATE_INLINE void populate_pages(void* data, std::size_t bytes) noexcept {
#if defined(__linux__)
#if !defined(MADV_POPULATE_WRITE)
  constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14; older C library headers lack the name
#endif
  if (data == nullptr || bytes == 0) return;
  // The pages holding the buffer's first and last bytes are the buffer's own (at least in part)
  // and mapped, so the page-aligned range around it is safe to populate; no byte is written.
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(data) / page * page;
  const auto end = (reinterpret_cast<std::uintptr_t>(data) + bytes + page - 1) / page * page;
  (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);  // a failure costs nothing
#else
  (void)data;
  (void)bytes;
#endif
}

ACCELERATE_INLINE CpuMemorySettings::CpuMemorySettings(bool retain_freed, bool huge_pages) noexcept {
  if (huge_pages) compat::request_cpu_huge_pages();
  if (retain_freed) retain_freed_memory();
  else return_freed_memory();
}

}  // namespace accelerate::detail
