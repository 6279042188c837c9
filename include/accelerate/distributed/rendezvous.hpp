// Rendezvous: connect every rank to rank 0's TCPStore, check that all ranks arrived within the
// timeout (naming the missing ones) and that they were built and started alike.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <accelerate/compat/c10d.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/distributed/process_environment.hpp>

namespace accelerate::distributed {

}  // namespace accelerate::distributed

namespace accelerate::detail {

std::string seconds(std::chrono::milliseconds timeout);

/// The first whitespace-separated field that differs between this rank's description and
/// rank `other`'s, as "field (rank N: field')", so that a mismatch error points at the cause.
std::string first_difference(const std::string& mine, const std::string& theirs, int other);

/// Runs `make()` and returns its result, or fails with `message()` when it has not returned
/// within `deadline`: c10d's store client can block far longer than its timeout on a peer
/// that accepts the connection and never answers. The late call is left to finish (or block)
/// on its own thread; its result, if any, is dropped.
template <class Make, class Message>
auto within_deadline(Make make, std::chrono::milliseconds deadline, Message message) {
  using Result = decltype(make());
  struct Shared {
    std::mutex mutex;
    std::condition_variable done;
    std::optional<Result> result;
    std::exception_ptr error;
    bool finished = false;
  };
  auto shared = std::make_shared<Shared>();
  std::thread([shared, make = std::move(make)]() mutable {
    std::optional<Result> result;
    std::exception_ptr error;
    try {
      result.emplace(make());
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(shared->mutex);
    shared->result = std::move(result);
    shared->error = error;
    shared->finished = true;
    shared->done.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(shared->mutex);
  if (!shared->done.wait_for(lock, deadline, [&] { return shared->finished; })) accelerate::detail::fail(message());
  if (shared->error) std::rethrow_exception(shared->error);
  return std::move(*shared->result);
}

}  // namespace accelerate::detail

namespace accelerate::distributed {

}  // namespace accelerate::distributed

namespace accelerate::detail {

/// Names the ranks of `env` whose key under `prefix` is missing, and whether the store still
/// answers (it does not once rank 0, which serves it, has exited).
std::pair<std::string, bool> missing_ranks(c10d::Store& store, const std::string& prefix,
                                           const distributed::ProcessEnvironment& env);

[[noreturn]] inline void fail_waiting(c10d::Store& store, const std::string& prefix, const distributed::ProcessEnvironment& env,
                                      std::chrono::milliseconds timeout, const char* what) {
  const auto [missing, answers] = missing_ranks(store, prefix, env);
  if (!answers && env.rank != 0) {
    accelerate::detail::fail("rendezvous (", what, "): rank ", env.rank, " of ", env.world_size,
                             " lost rank 0's store at ", env.master_addr, ":", env.master_port,
                             " while waiting: rank 0 ended (its error says why)");
  }
  accelerate::detail::fail("rendezvous (", what, "): rank ", env.rank, " waited ", seconds(timeout), " at ",
                           env.master_addr, ":", env.master_port, " but rank(s)", missing, " of ",
                           env.world_size, " never arrived (did they start, with the same MASTER_ADDR/PORT?)");
}

}  // namespace accelerate::detail

namespace accelerate::distributed {

/// Sets `<prefix>/<rank>` to `value` and waits until every rank has set its key. A rank that
/// does not arrive within `timeout` is named in the error. With `arrived`, each peer's value is
/// handed to it as soon as that peer's key appears (polling), so a check can end the wait
/// early instead of waiting for a rank that will never come.
void wait_for_all(c10d::Store& store, const std::string& prefix, const ProcessEnvironment& env,
                  const std::string& value, std::chrono::milliseconds timeout, const char* what,
                  const std::function<void(int, const std::string&)>& arrived = {});

/// After wait_for_all(prefix): checks that every rank published the same `mine`; the error
/// (raised on every rank, so none waits for a peer that is about to fail) names the first
/// rank that differs and the first differing field.
void check_same_everywhere(c10d::Store& store, const std::string& prefix,
                           const ProcessEnvironment& env, const std::string& mine,
                           const std::string& subject);

/// The process's connection to the rendezvous store of `env` (rank 0 serves it), made on
/// first use and kept for the process's lifetime, and the number of Accelerators that used it
/// before (0 for the first). Failing to serve or to reach it is an error naming the address.
std::pair<compat::StorePtr, int> process_store(const ProcessEnvironment& env,
                                               std::chrono::milliseconds timeout);

/// Claims this process's rank under `store`: a second process started with the same RANK
/// fails at once instead of joining in place of the first.
void claim_rank(c10d::Store& store, const ProcessEnvironment& env);

/// After every rank arrived: fails on each of them when some rank was claimed twice.
void check_claims(c10d::Store& store, const ProcessEnvironment& env);

/// Waits for every rank under `store` and checks that each rank's `fingerprint` (compile-time
/// policies, shared options and world size) equals every other's. A peer that differs is
/// reported as soon as it arrives, so ranks started with different world sizes name the
/// difference instead of waiting for a rank that does not exist for the other side.
void rendezvous_in(c10d::Store& store, const ProcessEnvironment& env, std::chrono::milliseconds timeout,
                   const std::string& fingerprint);

}  // namespace accelerate::distributed

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/distributed/rendezvous.ipp>
#endif
