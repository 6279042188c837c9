// Bodies of prefetcher.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/data/prefetcher.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE PrefetchQueue::PrefetchQueue(std::size_t first, std::size_t last, std::size_t workers,
                                               std::size_t depth, Produce produce)
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

ACCELERATE_INLINE std::shared_ptr<void> PrefetchQueue::next() {
  ACCELERATE_CHECK(take_ < last_, "Prefetcher: every batch up to ", last_, " was already taken");
  std::unique_lock lock(mutex_);
  produced_.wait(lock, [&] { return ready_.contains(take_); });
  auto node = ready_.extract(take_);
  ++take_;
  lock.unlock();
  space_.notify_all();
  if (node.mapped().error) std::rethrow_exception(node.mapped().error);
  return std::move(node.mapped().batch);
}

ACCELERATE_INLINE void PrefetchQueue::work() {
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
      result.batch = produce_(k);
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

ACCELERATE_INLINE void PrefetchQueue::stop() noexcept {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  space_.notify_all();
  for (auto& thread : threads_)
    if (thread.joinable()) thread.join();
}

}  // namespace accelerate::detail
