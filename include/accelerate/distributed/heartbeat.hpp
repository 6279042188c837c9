// Heartbeat: every rank counts up a key in the rendezvous store once a second, so that when a
// collective fails the survivors can say which rank stopped (a crash, a SIGKILL, a hang) or
// that rank 0's store itself is gone, instead of only "connection closed" or "timed out".
//
// A store connection over a dead link can block for as long as TCP lets it, so nothing here
// waits on one without a deadline: queries run on a helper thread that is abandoned (it owns
// everything it touches) when it does not answer in time.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <accelerate/compat/c10d.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/distributed/process_environment.hpp>

namespace accelerate::distributed {

class Heartbeat {
 public:
  /// Starts beating through its own connection to rank 0's store (so a stuck store never
  /// blocks the collectives' connection) under `prefix`. The connection is made by the beating
  /// thread, retried until it is up: a store slow to accept one more client (a loaded host,
  /// where a 5 s connect once failed a whole test job) neither fails nor delays start-up.
  Heartbeat(const ProcessEnvironment& env, const std::string& prefix,
            std::chrono::milliseconds interval = std::chrono::seconds(1));
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  /// Which ranks stopped beating, watched over a few intervals; or that the store does not
  /// answer. Called after a collective failed; returns within about 4 intervals.
  std::string diagnose();

 private:
  struct Shared {
    ProcessEnvironment env;
    std::string prefix;
    std::chrono::milliseconds interval{1000};
    compat::StorePtr store;  // set by the beating thread once connected (under `mutex`)
    std::mutex mutex;
    std::condition_variable wake;
    bool stop = false;

    std::string key(int rank) const { return prefix + "/beat/" + std::to_string(rank); }
    compat::StorePtr connected() {
      std::lock_guard<std::mutex> lock(mutex);
      return store;
    }
    std::vector<int64_t> counts() {
      const compat::StorePtr held = connected();
      if (!held) throw std::runtime_error("the heartbeat is not connected to the store yet");
      std::vector<int64_t> out;
      for (int r = 0; r < env.world_size; ++r) out.push_back(held->add(key(r), 0));
      return out;
    }
    void run() {
      std::unique_lock<std::mutex> lock(mutex);
      while (!stop && !store) {
        lock.unlock();
        compat::StorePtr made;
        try {
          made = compat::make_tcp_store(env.master_addr, env.master_port, /*is_server=*/false, env.world_size,
                                        std::max(interval * 5, std::chrono::milliseconds(5000)));
        } catch (const std::exception&) {
          // Not yet (or rank 0 is gone: then diagnose() says the store does not answer).
        }
        lock.lock();
        if (made) store = std::move(made);
        else wake.wait_for(lock, interval, [this] { return stop; });
      }
      const compat::StorePtr held = store;
      while (!stop) {
        lock.unlock();
        try {
          held->add(key(env.rank), 1);
        } catch (const std::exception&) {
          // The store went away (rank 0 finished first, or failed); diagnose() will say so.
        }
        lock.lock();
        wake.wait_for(lock, interval, [this] { return stop; });
      }
    }
  };

  // Every rank's count, or nothing when the store does not answer within 4 intervals. The
  // query runs on a detached thread that owns what it uses, so a dead connection cannot hold
  // the caller (std::async's future would join it).
  static std::optional<std::vector<int64_t>> query(const std::shared_ptr<Shared>& shared);

  static std::string unreachable(const Shared& shared) {
    return "rank 0's rendezvous store at " + shared.env.master_addr + ":" + std::to_string(shared.env.master_port) +
           " does not answer (rank 0 exited, or the network to it is down)";
  }

  std::shared_ptr<Shared> shared_;
};

}  // namespace accelerate::distributed

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/distributed/heartbeat.ipp>
#endif
