// Keeping freed CPU tensor buffers in the heap (glibc only). With glibc's defaults, a training
// step's large temporaries are mmapped or trimmed from the top of the heap when freed and
// page-faulted back in on the next step; measured at 15-20% of a step on an MNIST-sized MLP
// with gradient accumulation (bench/README.md).
#pragma once

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace accelerate::detail {

/// Raises glibc's mmap threshold to 32 MB and its trim threshold to 128 MB, once per process.
inline void retain_freed_memory() noexcept {
#if defined(__GLIBC__)
  static const bool done = [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
    return true;
  }();
  (void)done;
#endif
}

}  // namespace accelerate::detail
