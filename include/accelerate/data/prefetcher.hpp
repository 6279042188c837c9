// Prefetcher: worker threads that produce a run of batches ahead of the training thread, in a
// bounded window, and hand them over strictly in order.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <accelerate/detail/check.hpp>

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
      : produce_(std::move(produce)), claim_(first), take_(first), last_(last), depth_(depth) {
    ACCELERATE_CHECK(workers > 0 && depth > 0, "Prefetcher: needs at least one worker and a depth of at least 1 (got ",
                     workers, " workers, depth ", depth, ")");
    threads_.reserve(workers);
    try {
      for (std::size_t w = 0; w < workers; ++w) threads_.emplace_back([this] { work(); });
    } catch (...) {
      stop();
      throw;
    }
  }

  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  ~Prefetcher() { stop(); }

  /// Whether a batch is left to take.
  bool has_next() const noexcept { return take_ < last_; }

  /// The next batch in order, waiting for it if a worker is still producing it.
  Batch next() {
    ACCELERATE_CHECK(take_ < last_, "Prefetcher: every batch up to ", last_, " was already taken");
    std::unique_lock lock(mutex_);
    produced_.wait(lock, [&] { return ready_.contains(take_); });
    auto node = ready_.extract(take_);
    ++take_;
    lock.unlock();
    space_.notify_all();
    if (node.mapped().error) std::rethrow_exception(node.mapped().error);
    return std::move(*node.mapped().batch);
  }

 private:
  struct Result {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };

  void work() {
    for (;;) {
      std::size_t k;
      {
        std::unique_lock lock(mutex_);
        space_.wait(lock, [&] { return stopping_ || claim_ >= last_ || claim_ < take_ + depth_; });
        if (stopping_ || claim_ >= last_) return;
        k = claim_++;
      }
      Result result;
      try {
        result.batch.emplace(produce_(k));
      } catch (...) {
        result.error = std::current_exception();
      }
      {
        std::lock_guard lock(mutex_);
        ready_.emplace(k, std::move(result));
      }
      produced_.notify_all();
    }
  }

  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    space_.notify_all();
    for (auto& thread : threads_)
      if (thread.joinable()) thread.join();
  }

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

}  // namespace accelerate::data
