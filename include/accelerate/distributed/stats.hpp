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

/// Time this process spent on collectives, in seconds.
struct CommTime {
  /// Time with at least one collective in flight, from its launch to its completion as this
  /// process observes it (with NCCL: when the host learns of it).
  double busy_seconds = 0;
  /// Of that, the time the training thread was blocked waiting: the wait for gradient buckets
  /// at the end of backward, and the whole of every blocking collective (gather, reduce,
  /// barrier, ...). Communication hidden under computation is the rest.
  double exposed_seconds = 0;

  /// The share of communication hidden under computation, 1 - exposed/busy (0 when none ran).
  double overlap() const noexcept {
    if (busy_seconds <= 0) return 0;
    const double hidden = 1.0 - exposed_seconds / busy_seconds;
    return hidden < 0 ? 0 : hidden;
  }
  CommTime& operator+=(const CommTime& o) noexcept {
    busy_seconds += o.busy_seconds;
    exposed_seconds += o.exposed_seconds;
    return *this;
  }
  friend CommTime operator-(CommTime a, const CommTime& b) noexcept {
    a.busy_seconds -= b.busy_seconds;
    a.exposed_seconds -= b.exposed_seconds;
    return a;
  }
  friend bool operator==(const CommTime&, const CommTime&) = default;
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
  /// Gradient all-reduce bytes (a subset of `allreduce`), from the bucketed reducer: what was
  /// really sent, so a compressed bucket (DdpOptions::compression) counts its compressed size.
  CollectiveCount gradient_allreduce;
  /// Backward passes whose gradients were synchronised (one per optimizer step with
  /// accumulation; each may use several bucket all-reduces).
  std::uint64_t grad_sync_rounds = 0;
  /// reduce_scatter calls and their input bytes (sharded backends: gradients to their owners).
  CollectiveCount reduce_scatter;
  /// Point-to-point sends and their bytes (the stage-3 save_model streams slices to rank 0).
  CollectiveCount point_to_point;
  /// Time on collectives since the start (`time.overlap()`: the share hidden under backward).
  CommTime time;
  /// The same for the last synchronised step: from the end of the previous gradient
  /// synchronisation to the end of the latest, so its gradient buckets and every collective
  /// called in between (a loss gathered for logging, ...).
  /// Example:
  ///   acc.log({{"comm/exposed_ms", 1e3 * acc.stats().last_step.exposed_seconds}}, step);
  CommTime last_step;

  friend bool operator==(const CommStats&, const CommStats&) = default;
};

inline std::ostream& operator<<(std::ostream& out, const CommStats& s) {
  return out << "allreduce " << s.allreduce.calls << " calls/" << s.allreduce.bytes
             << " B, broadcast " << s.broadcast.calls << "/" << s.broadcast.bytes << " B, allgather "
             << s.allgather.calls << "/" << s.allgather.bytes << " B, barrier " << s.barrier.calls
             << ", reduce_scatter " << s.reduce_scatter.calls << "/" << s.reduce_scatter.bytes
             << " B, point_to_point " << s.point_to_point.calls << "/" << s.point_to_point.bytes
             << " B, gradient sync rounds " << s.grad_sync_rounds << ", communication " << s.time.busy_seconds
             << " s of which exposed " << s.time.exposed_seconds << " s";
}

}  // namespace accelerate
