// Tests of include/accelerate/data/prefetcher.hpp: order, the bounded window, errors and
// stopping early.
#include <accelerate/data/prefetcher.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

// Later batches are often ready first (batch k takes (7k mod 5) * 200 us): order must still hold.
std::size_t slow_identity(std::size_t k) {
  std::this_thread::sleep_for(std::chrono::microseconds(200 * ((7 * k) % 5)));
  return k;
}

TEST(Prefetcher, DeliversInOrderWhicheverWorkerFinishesFirst) {
  for (const std::size_t workers : {1u, 2u, 4u}) {
    accelerate::data::Prefetcher<std::size_t> ahead(3, 40, workers, 2 * workers, slow_identity);
    std::vector<std::size_t> got;
    while (ahead.has_next()) got.push_back(ahead.next());
    std::vector<std::size_t> expected;
    for (std::size_t k = 3; k < 40; ++k) expected.push_back(k);
    EXPECT_EQ(got, expected) << workers << " workers";
  }
}

TEST(Prefetcher, ProducesAtMostDepthBatchesAhead) {
  constexpr std::size_t depth = 3;
  std::atomic<std::size_t> taken{0};
  std::atomic<std::size_t> furthest_ahead{0};
  accelerate::data::Prefetcher<std::size_t> ahead(0, 50, 4, depth, [&](std::size_t k) {
    // taken is updated after next() returns, so it lags the window's edge by at most one.
    const std::size_t ahead_by = k - std::min(k, taken.load());
    std::size_t seen = furthest_ahead.load();
    while (ahead_by > seen && !furthest_ahead.compare_exchange_weak(seen, ahead_by)) {}
    return k;
  });
  for (std::size_t k = 0; k < 50; ++k) {
    std::this_thread::sleep_for(200us);  // a slow consumer: the workers would run to the end
    EXPECT_EQ(ahead.next(), k);
    taken = k + 1;
  }
  EXPECT_LE(furthest_ahead.load(), depth);
  EXPECT_GE(furthest_ahead.load(), depth - 1) << "the workers never filled the window";
}

TEST(Prefetcher, AnErrorArrivesAtItsBatchAfterTheBatchesBeforeIt) {
  accelerate::data::Prefetcher<std::size_t> ahead(0, 10, 3, 6, [](std::size_t k) {
    if (k == 5) throw std::runtime_error("sample 5 is corrupt");
    return slow_identity(k);
  });
  for (std::size_t k = 0; k < 5; ++k) EXPECT_EQ(ahead.next(), k);
  try {
    ahead.next();
    FAIL() << "batch 5 should have thrown";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "sample 5 is corrupt");
  }
  EXPECT_EQ(ahead.next(), 6u) << "the batches after a failed one are still delivered";
}

TEST(Prefetcher, DestroyedEarlyStopsItsWorkersWithoutFinishingTheRun) {
  std::atomic<std::size_t> produced{0};
  {
    accelerate::data::Prefetcher<std::size_t> ahead(0, 100000, 2, 4, [&](std::size_t k) {
      ++produced;
      std::this_thread::sleep_for(100us);
      return k;
    });
    EXPECT_EQ(ahead.next(), 0u);
    std::this_thread::sleep_for(20ms);  // the workers fill the window and wait
  }  // joins here: waiting workers wake up and leave
  EXPECT_LE(produced.load(), 1u + 4u + 2u) << "taken + window + one in flight per worker";
}

TEST(Prefetcher, RefusesNoWorkersOrNoDepth) {
  auto make = [](std::size_t workers, std::size_t depth) {
    accelerate::data::Prefetcher<int> p(0, 1, workers, depth, [](std::size_t) { return 0; });
  };
  EXPECT_THROW(make(0, 2), accelerate::Error);
  EXPECT_THROW(make(2, 0), accelerate::Error);
}

}  // namespace
