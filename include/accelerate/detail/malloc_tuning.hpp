// What the C library does with freed CPU tensor buffers (glibc only; AcceleratorOptions::
// retain_freed_memory). Retained: with glibc's defaults a training step's large temporaries are
// mmapped or trimmed from the top of the heap when freed and page-faulted back in on the next
// step, measured at 15-20% of a step on an MNIST-sized MLP with gradient accumulation; keeping
// them saves that. Returned: glibc raises its mmap threshold to the size of the largest buffer
// freed so far, after which buffers of that size come from the heap and their freed pages stay
// resident, so a step whose transients come and go (ZeRO's gathered units, gradient buckets,
// Gloo's reduce-scatter buffers, autograd's gradients) keeps the sum of them resident; with
// the threshold fixed low they go back to the system when freed (bench/README.md, "Where a
// rank's memory goes").
#pragma once

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace accelerate::detail {

/// Keeps freed CPU buffers in the process heap: glibc's mmap threshold 32 MB, trim threshold
/// 128 MB. Process-wide; the last Accelerator built decides.
inline void retain_freed_memory() noexcept {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
#endif
}

/// Hands freed CPU buffers of 4 MB and more back to the system at once: glibc's mmap threshold
/// fixed at 4 MB (a fixed threshold is never raised), trim threshold 4 MB; what the heap
/// holds free now is handed back too. Process-wide.
inline void return_freed_memory() noexcept {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 4 << 20);
  mallopt(M_TRIM_THRESHOLD, 4 << 20);
  malloc_trim(0);  // and what an earlier setting kept
#endif
}

}  // namespace accelerate::detail
