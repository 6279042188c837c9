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
// Huge pages: whichever way, a buffer faulted in again costs one page fault per 4 KB page; on
// 2 MB pages, 512 times fewer. Measured side by side (40M parameters, 2 ranks, CPU), they made
// steps 1.07-1.3x faster for data parallel and every ZeRO stage, kept or handed back, at equal
// or lower peak memory (bench/README.md, the same section).
#pragma once

#include <accelerate/compat/torch.hpp>
#include <accelerate/detail/linkage.hpp>

#include <cstddef>
#include <cstdint>

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace accelerate::detail {

/// Keeps freed CPU buffers in the process heap: glibc's mmap threshold 32 MB, trim threshold
/// 128 MB. Process-wide; the last Accelerator built decides.
void retain_freed_memory() noexcept;

/// Hands freed CPU buffers of 4 MB and more back to the system at once: glibc's mmap threshold
/// fixed at 4 MB (a fixed threshold is never raised), trim threshold 4 MB; what the heap
/// holds free now is handed back too. Process-wide.
void return_freed_memory() noexcept;

/// Maps every page of the fresh buffer [data, data + bytes) writable in one call (Linux 5.14's
/// madvise(MADV_POPULATE_WRITE)) without touching its bytes, so that a copy into it runs at
/// memory speed instead of faulting page by page. A copy of 300 MB into fresh memory on huge
/// pages measured 53-381 ms faulting as it went, 29 ms to populate + 25 ms to copy
/// (bench/README.md, "Asynchronous save"). Does nothing where the call is not available.
void populate_pages(void* data, std::size_t bytes) noexcept;

/// The process-wide CPU memory settings an Accelerator applies. A member declared ahead of the
/// others, so they apply before anything the Accelerator does allocates (huge pages take effect
/// only for a process that has not allocated a CPU tensor yet).
struct CpuMemorySettings {
  CpuMemorySettings(bool retain_freed, bool huge_pages) noexcept;
};

}  // namespace accelerate::detail

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/detail/malloc_tuning.ipp>
#endif
