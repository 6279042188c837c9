// Prefetcher: worker threads that produce a run of batches ahead of the training thread, in a
// bounded window, and hand them over strictly in order.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate::detail {

/// Prefetcher's machinery, whatever the batch type: the worker threads, the window and the
/// order. Each batch travels type-erased (one small allocation per batch, next to the
/// batch's own tensors), so a trainer's translation unit does not generate the threads'
/// code again for its batch type.
class PrefetchQueue {
 public:
  using Produce = std::function<std::shared_ptr<void>(std::size_t)>;

  PrefetchQueue(std::size_t first, std::size_t last, std::size_t workers, std::size_t depth, Produce produce);
  PrefetchQueue(const PrefetchQueue&) = delete;
  PrefetchQueue& operator=(const PrefetchQueue&) = delete;
  ~PrefetchQueue() { stop(); }

  bool has_next() const noexcept { return take_ < last_; }
  /// The next batch in order (rethrows what producing it threw).
  std::shared_ptr<void> next();

 private:
  struct Result {
    std::shared_ptr<void> batch;
    std::exception_ptr error;
  };

  void work();
  void stop() noexcept;

  Produce produce_;
  std::mutex mutex_;
  std::condition_variable space_;     // a slot in the window opened, or stop
  std::condition_variable produced_;  // a batch became ready
  std::size_t claim_;                 // next batch a worker will produce
  std::size_t take_;                  // next batch next() returns
  std::size_t last_;
  std::size_t depth_;
  bool stopping_ = false;
  std::map<std::size_t, Result> ready_;
  std::vector<std::thread> threads_;
};

}  // namespace accelerate::detail

namespace accelerate::data {

/// Produces batches `first`..`last - 1` with `workers` threads, at most `depth` batches ahead of
/// the one next() returns. Which thread produced a batch never shows: next() returns batch k
/// only after batch k-1, so the sequence is the one a loop calling produce(k) would give, for
/// any number of workers. `produce` is called concurrently from the workers, each index once.
/// An exception thrown by produce(k) is rethrown by the next() that reaches batch k (batches
/// before it are delivered first). Destruction stops the workers (a batch being produced is
/// finished, nothing new is started) and joins them.
/// Example:
///   accelerate::data::Prefetcher<at::Tensor> ahead(0, 100, /*workers=*/2, /*depth=*/4,
///                                                  [&](std::size_t k) { return load(k); });
///   for (std::size_t k = 0; k < 100; ++k) use(ahead.next());
template <class Batch>
class Prefetcher {
 public:
  using Produce = std::function<Batch(std::size_t)>;

  Prefetcher(std::size_t first, std::size_t last, std::size_t workers, std::size_t depth, Produce produce)
      : queue_(first, last, workers, depth, [produce = std::move(produce)](std::size_t k) -> std::shared_ptr<void> {
          return std::make_shared<Batch>(produce(k));
        }) {}

  /// Whether a batch is left to take.
  bool has_next() const noexcept { return queue_.has_next(); }

  /// The next batch in order, waiting for it if a worker is still producing it.
  Batch next() { return std::move(*std::static_pointer_cast<Batch>(queue_.next())); }

 private:
  detail::PrefetchQueue queue_;
};

}  // namespace accelerate::data

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/data/prefetcher.ipp>
#endif
