// Communicator: this process's c10d backend and the collectives the accelerator needs,
// counted in CommStats. Errors say which collective failed on which rank.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <accelerate/compat/c10d.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/distributed/reduction.hpp>
#include <accelerate/distributed/stats.hpp>

namespace accelerate::distributed {

/// A collective started asynchronously: its c10d work and when it started, so that the time it
/// was in flight and the time spent waiting for it count in CommStats::time.
struct InFlight {
  compat::WorkPtr work;
  std::chrono::steady_clock::time_point started;
  /// When c10d marked it complete (steady-clock ticks; 0 until then), stamped by a callback
  /// or by the wait that saw it done first. Every InFlight a Communicator returns has one.
  std::shared_ptr<std::atomic<std::chrono::steady_clock::rep>> finished;
  /// Runs on the waiting thread once the work has completed (a reduce-scatter made of an
  /// all-to-all sums what it received here); empty for most collectives. Not on the c10d
  /// thread that completes the work: there the sums delayed Gloo's next collective and made
  /// ZeRO steps on 3 ranks 10-15 % longer (bench_zero, 40M parameters, 2 cores).
  std::function<void()> complete;

  explicit operator bool() const noexcept { return static_cast<bool>(work); }
  void reset() noexcept;
};

/// Collectives over one c10d backend. Thread-safe counting: gradient hooks may run on
/// autograd's device threads.
/// Example:
///   comm.all_reduce(t, accelerate::Reduction::sum);
class Communicator {
 public:
  Communicator(compat::BackendPtr backend, int rank, int world_size)
      : backend_(std::move(backend)), rank_(rank), world_size_(world_size) {}

  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }
  c10d::Backend& backend() noexcept { return *backend_; }

  /// In-place all-reduce. Gloo has no AVG, so mean is a sum divided by the world size.
  void all_reduce(at::Tensor& tensor, Reduction reduction);

  /// Starts a sum all-reduce of `tensor` (gradient buckets, counted as such too); wait() for it.
  InFlight all_reduce_async(at::Tensor& tensor);

  /// In-place broadcast from `root`.
  void broadcast(at::Tensor& tensor, int root);

  /// Every rank's copy of `tensor` (same shape everywhere), in rank order.
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor);

  /// This rank's slice of the element-wise reduction of `tensor` across ranks: dimension 0 is
  /// split into world_size equal slices and rank r receives slice r (c10d's
  /// reduce_scatter_tensor). Dimension 0 must be divisible by the world size.
  at::Tensor reduce_scatter(const at::Tensor& tensor, Reduction reduction);

  /// Starts a reduce-scatter of `input` (its length divisible by the world size) into `output`
  /// (1/world_size of it: rank r receives slice r) and returns its work handle (sharded
  /// gradient buckets start one per bucket and wait later); `output` holds the result once
  /// wait() returns. Counted under reduce_scatter with its input bytes. A mean is a sum the
  /// caller divides (as reduce_scatter does).
  ///
  /// On Gloo (unless use_all_to_all_reduce_scatter(false)) a sum is an all-to-all: rank r
  /// receives every rank's slice r and adds them here, in rank order. c10d's Gloo
  /// reduce-scatter all-reduces a copy of the whole input and keeps one slice, sending twice
  /// the bytes; the all-to-all halves a 25 MB reduce-scatter's time at the same memory and
  /// makes ZeRO steps 6-15 % faster (bench/README.md), and its sums do not depend on where a
  /// slice lies in the input (a ring all-reduce starts each chunk's sum at another rank).
  InFlight reduce_scatter_async(at::Tensor& input, at::Tensor& output, Reduction reduction = Reduction::sum);

  /// Whether `work` has completed (never blocks; its wait() still runs InFlight::complete).
  static bool done(const InFlight& work) { return work.work->isCompleted(); }

  /// Whether gradient_sum_scatter_async/gradient_sum_gather_async add each element's values
  /// in rank order (rank 0's + rank 1's + ...): on Gloo with the all-to-all reduce-scatter.
  bool sums_in_rank_order() const { return all_to_all_reduce_scatter_ && backend_->getBackendName() == "gloo"; }

  /// A gradient bucket's sum all-reduce in two halves, so that every element is added in rank
  /// order wherever it lies in the bucket (a ring all-reduce starts each chunk's sum at another
  /// rank; DdpOptions::sum_in_rank_order). `bucket` is 1-D, contiguous, its length divisible by
  /// the world size; rank r's slice is its r-th 1/world_size. This starts the reduce-scatter:
  /// once waited for, this rank's slice of `bucket` holds its sum. gradient_sum_gather_async
  /// then exchanges the slices in place. Counted as one gradient all-reduce of the bucket: the
  /// same bytes on the wire as a ring all-reduce's.
  /// Example:
  ///   auto work = comm.gradient_sum_scatter_async(flat);  comm.wait(work, "...");
  ///   for (auto& w : comm.gradient_sum_gather_async(flat, tag)) comm.wait(w, "...");
  InFlight gradient_sum_scatter_async(at::Tensor& bucket);
  /// The second half of gradient_sum_scatter_async: this rank's summed slice of `bucket` sent
  /// to every other rank, theirs received into their slices, point to point with `tag` (the
  /// same on every rank, distinct per bucket in flight). Not c10d's all-gather, which on Gloo
  /// gathers into a flat copy and copies it out again (a pass over the gradients per step).
  std::vector<InFlight> gradient_sum_gather_async(at::Tensor& bucket, int tag);

  /// Every rank's `input` (the same length everywhere) into `output`, in rank order, as one
  /// flat all-gather (sharded parameters made whole). `what` names it in errors.
  void all_gather_into(at::Tensor& output, at::Tensor& input, const char* what) {
    wait(all_gather_into_async(output, input), what);
  }
  /// Starts all_gather_into and returns its work handle (stage 3 prefetches the next unit's
  /// parameters while the current one computes); wait() for it.
  InFlight all_gather_into_async(at::Tensor& output, at::Tensor& input);

  /// Starts sending `tensor` (contiguous) to rank `to`; rank `to` receives it with
  /// recv_async(..., from = this rank, the same tag). Point to point, so unlike the collectives
  /// it is not part of the layout check; counted under CommStats::point_to_point (bytes sent).
  /// Example (the sharded save_model streams parameter slices to rank 0 so):
  ///   auto sent = comm.send_async(slice, 0, tag);  comm.wait(sent, "send");
  InFlight send_async(at::Tensor& tensor, int to, int tag);
  /// Starts receiving into `tensor` (contiguous, the sent size) what rank `from` sends with `tag`.
  InFlight recv_async(at::Tensor& tensor, int from, int tag);

  void barrier();

  /// Waits for a collective; a failure (peer gone, timeout) becomes an accelerate::Error
  /// naming the collective, this rank and, from the heartbeat, which rank stopped. The time
  /// blocked here is exposed communication (CommStats::time).
  void wait(const InFlight& work, const char* what);

  /// Turns on collective verification (ProcessGroupOptions::verify_collectives): before each
  /// collective, every rank all-gathers a 5-integer description of it (which collective, dtype,
  /// element count, root or reduction, and how many collectives it made before), so ranks that
  /// call different collectives, or the same one with other sizes, get an accelerate::Error
  /// naming both ranks instead of Gloo aborting the process on a size mismatch. One extra
  /// small collective per collective: meant for debugging. `device` holds the descriptions
  /// (NCCL takes device tensors only).
  void verify_collectives(c10::Device device) {
    verify_ = true;
    verify_device_ = device;
  }

  /// Whether a Gloo reduce-scatter sum is an all-to-all (the default) or c10d's own
  /// (ProcessGroupOptions::reduce_scatter_all_to_all). Every rank must choose the same.
  void use_all_to_all_reduce_scatter(bool on) noexcept { all_to_all_reduce_scatter_ = on; }

  /// How to explain a failed collective (the engine's heartbeat).
  void set_diagnosis(std::function<std::string()> diagnose) { diagnose_ = std::move(diagnose); }

  CommStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  /// Counts one completed gradient synchronisation round, which ends a step in
  /// CommStats::last_step.
  void count_grad_sync_round();

 private:
  // Stamps a collective's start and, from c10d's completion callback, its end.
  InFlight start(compat::WorkPtr work);

  // Rank r's 1/world_size of a 1-D tensor.
  at::Tensor own_slice(const at::Tensor& flat, int r) const {
    const int64_t length = flat.numel() / world_size_;
    return flat.narrow(0, r * length, length);
  }

  // A reduce-scatter, uncounted and unchecked (see reduce_scatter_async).
  InFlight start_reduce_scatter(at::Tensor& input, at::Tensor& output, Reduction reduction);

  // Records `now` as a collective's completion unless one was recorded first (the callback
  // and the wait race; the earlier stamp is the truer one).
  static void stamp(std::atomic<std::chrono::steady_clock::rep>& finished, std::chrono::steady_clock::time_point now) {
    auto unset = std::chrono::steady_clock::rep{0};
    finished.compare_exchange_strong(unset, now.time_since_epoch().count());
  }

  // The busy time a collective in flight from `started` to `finished` adds to the union of the
  // earlier ones (collectives on one group complete in order, so the union is the part after
  // the last completion), and the time blocked waiting for it.
  CommTime busy_since(std::chrono::steady_clock::time_point started, std::chrono::steady_clock::time_point finished,
                      std::chrono::steady_clock::duration blocked);
  // A mean is a sum divided by the world size (Gloo has no AVG); integers round down.
  void divide_by_world(at::Tensor& sum) const {
    if (sum.is_floating_point()) sum.div_(world_size_);
    else sum.floor_divide_(world_size_);
  }

  static c10d::ReduceOp to_reduce_op(Reduction reduction);

  enum class CollectiveOp : std::int64_t { all_reduce = 1, broadcast, all_gather, barrier, reduce_scatter };
  static const char* op_name(std::int64_t op);
  static std::string describe(const std::int64_t* d);

  // With verification on: the same description from every rank, or an error on each of them.
  void agree(CollectiveOp op, const at::Tensor* t, std::int64_t argument);

  static std::uint64_t bytes(const at::Tensor& t) {
    return static_cast<std::uint64_t>(t.numel()) * t.element_size();
  }
  void count(CollectiveCount& counter, const at::Tensor& t) {
    std::lock_guard<std::mutex> lock(mutex_);
    counter.add(bytes(t));
  }

  compat::BackendPtr backend_;
  int rank_;
  int world_size_;
  mutable std::mutex mutex_;
  CommStats stats_;
  CommTime step_started_;  // stats_.time when the current step began
  std::chrono::steady_clock::time_point busy_until_{};
  std::function<std::string()> diagnose_;
  bool verify_ = false;
  bool all_to_all_reduce_scatter_ = true;
  c10::Device verify_device_{c10::kCPU};
  std::int64_t verified_calls_ = 0;
};

/// Broadcasts `tensors` from `root` in place, in flat pieces of at most `piece_bytes` per dtype
/// (a contiguous tensor as large as that goes alone, without a copy). Pieces, not one flat copy
/// of everything: at prepare that copy was a second model at once (bench/README.md, "Where a
/// rank's memory goes"). Every rank must pass the same shapes and dtypes.
void broadcast_flat(Communicator& comm, const std::vector<at::Tensor>& tensors, int root,
                    std::size_t piece_bytes = std::size_t{64} << 20);

}  // namespace accelerate::distributed

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/distributed/communicator.ipp>
#endif
