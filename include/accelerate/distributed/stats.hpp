// CommStats: calls and bytes per collective kind, so sync overhead is visible to users and
// benchmarks. Light: no c10d include.
#pragma once

#include <cstdint>
#include <ostream>

namespace accelerate {

/// Count and payload of one kind of collective.
struct CollectiveCount {
  std::uint64_t calls = 0;
  std::uint64_t bytes = 0;

  void add(std::uint64_t payload_bytes) noexcept {
    ++calls;
    bytes += payload_bytes;
  }
  friend bool operator==(const CollectiveCount&, const CollectiveCount&) = default;
};

/// What this process sent through collectives since the Accelerator was built. Bytes are the
/// payload handed to the collective on this rank (a bucket's size for all-reduce).
/// Example:
///   acc.stats().allreduce.calls;  acc.stats().grad_sync_rounds;
struct CommStats {
  CollectiveCount allreduce;
  CollectiveCount broadcast;
  CollectiveCount allgather;
  CollectiveCount barrier;
  /// Gradient all-reduce bytes (a subset of `allreduce`), from the bucketed reducer.
  CollectiveCount gradient_allreduce;
  /// Backward passes whose gradients were synchronised (one per optimizer step with
  /// accumulation; each may use several bucket all-reduces).
  std::uint64_t grad_sync_rounds = 0;
  /// reduce_scatter calls and their input bytes (sharded backends: gradients to their owners).
  CollectiveCount reduce_scatter;

  friend bool operator==(const CommStats&, const CommStats&) = default;
};

inline std::ostream& operator<<(std::ostream& out, const CommStats& s) {
  return out << "allreduce " << s.allreduce.calls << " calls/" << s.allreduce.bytes
             << " B, broadcast " << s.broadcast.calls << "/" << s.broadcast.bytes << " B, allgather "
             << s.allgather.calls << "/" << s.allgather.bytes << " B, barrier " << s.barrier.calls
             << ", reduce_scatter " << s.reduce_scatter.calls << "/" << s.reduce_scatter.bytes
             << " B, gradient sync rounds " << s.grad_sync_rounds;
}

}  // namespace accelerate
