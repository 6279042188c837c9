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

ACCELERATE_INLINE CpuMemorySettings::CpuMemorySettings(bool retain_freed, bool huge_pages) noexcept {
  if (huge_pages) compat::request_cpu_huge_pages();
  if (retain_freed) retain_freed_memory();
  else return_freed_memory();
}

}  // namespace accelerate::detail
