// Bodies of rendezvous.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/distributed/rendezvous.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE std::string seconds(std::chrono::milliseconds timeout) {
  std::ostringstream out;
  out << static_cast<double>(timeout.count()) / 1000.0 << " s";
  return out.str();
}

ACCELERATE_INLINE std::string first_difference(const std::string& mine, const std::string& theirs, int other) {
  std::istringstream a(mine), b(theirs);
  std::string x, y;
  const std::string them = "rank " + std::to_string(other);
  while (true) {
    const bool more_a = static_cast<bool>(a >> x), more_b = static_cast<bool>(b >> y);
    if (!more_a && !more_b) return "(identical)";
    if (!more_a) return them + " has an extra field " + y;
    if (!more_b) return "this rank has an extra field " + x;
    if (x != y) return x + " (" + them + ": " + y + ")";
  }
}

ACCELERATE_INLINE std::pair<std::string, bool> missing_ranks(
    c10d::Store& store, const std::string& prefix, const distributed::ProcessEnvironment& env) {
  std::ostringstream missing;
  int count = 0;
  bool answers = true;
  for (int r = 0; r < env.world_size; ++r) {
    bool present = false;
    try {
      present = store.check({prefix + "/" + std::to_string(r)});
    } catch (const std::exception&) {
      answers = false;
      break;
    }
    if (!present) missing << (count++ ? ", " : " ") << r;
  }
  return {missing.str(), answers};
}

}  // namespace accelerate::detail

namespace accelerate::distributed {

ACCELERATE_INLINE void wait_for_all(c10d::Store& store, const std::string& prefix, const ProcessEnvironment& env,
                                    const std::string& value, std::chrono::milliseconds timeout, const char* what,
                                    const std::function<void(int, const std::string&)>& arrived) {
  store.set(prefix + "/" + std::to_string(env.rank), value);
  if (!arrived) {
    std::vector<std::string> keys;
    for (int r = 0; r < env.world_size; ++r) keys.push_back(prefix + "/" + std::to_string(r));
    try {
      store.wait(keys, timeout);
    } catch (const std::exception&) {
      detail::fail_waiting(store, prefix, env, timeout, what);
    }
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<bool> seen(static_cast<std::size_t>(env.world_size), false);
  seen[static_cast<std::size_t>(env.rank)] = true;
  int waiting = env.world_size - 1;
  while (waiting > 0) {
    for (int r = 0; r < env.world_size; ++r) {
      if (seen[static_cast<std::size_t>(r)]) continue;
      const std::string key = prefix + "/" + std::to_string(r);
      bool present = false;
      try {
        present = store.check({key});
      } catch (const std::exception&) {
        detail::fail_waiting(store, prefix, env, timeout, what);
      }
      if (!present) continue;
      const auto bytes = store.get(key);
      arrived(r, std::string(bytes.begin(), bytes.end()));
      seen[static_cast<std::size_t>(r)] = true;
      --waiting;
    }
    if (waiting == 0) break;
    if (std::chrono::steady_clock::now() > deadline) detail::fail_waiting(store, prefix, env, timeout, what);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

ACCELERATE_INLINE void check_same_everywhere(c10d::Store& store, const std::string& prefix,
                                             const ProcessEnvironment& env, const std::string& mine,
                                             const std::string& subject) {
  for (int r = 0; r < env.world_size; ++r) {
    if (r == env.rank) continue;
    const auto bytes = store.get(prefix + "/" + std::to_string(r));
    const std::string theirs(bytes.begin(), bytes.end());
    ACCELERATE_CHECK(theirs == mine, subject, ": rank ", env.rank, " and rank ", r, " differ: ",
                     detail::first_difference(mine, theirs, r), ". Rank ", env.rank, ": ", mine,
                     "; rank ", r, ": ", theirs);
  }
}

ACCELERATE_INLINE std::pair<compat::StorePtr, int> process_store(
    const ProcessEnvironment& env, std::chrono::milliseconds timeout) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, std::pair<compat::StorePtr, int>> stores;
  std::lock_guard<std::mutex> lock(mutex);
  auto& [store, uses] = stores[{env.master_addr, env.master_port}];
  if (!store) {
    try {
      store = detail::within_deadline(
          [host = env.master_addr, port = env.master_port, server = env.rank == 0, world = env.world_size,
           timeout] { return compat::make_tcp_store(host, port, server, world, timeout); },
          timeout + std::chrono::seconds(2), [&] {
            std::ostringstream what;
            what << "rendezvous: rank " << env.rank << " connected to " << env.master_addr << ":" << env.master_port
                 << " but no store answered there within " << detail::seconds(timeout)
                 << " (another program holding the port?)";
            return what.str();
          });
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      if (env.rank == 0) {
        accelerate::detail::fail("rendezvous: rank 0 could not serve the store on ", env.master_addr, ":",
                                 env.master_port, " (port in use, or not this host's address?): ", e.what());
      }
      accelerate::detail::fail("rendezvous: rank ", env.rank, " could not reach rank 0's store at ",
                               env.master_addr, ":", env.master_port, " within ", detail::seconds(timeout),
                               " (is rank 0 running?): ", e.what());
    }
  }
  return {store, uses++};
}

ACCELERATE_INLINE void claim_rank(c10d::Store& store, const ProcessEnvironment& env) {
  const auto claims = store.add("claims/" + std::to_string(env.rank), 1);
  ACCELERATE_CHECK(claims == 1, "rendezvous: two processes started as rank ", env.rank, " of ", env.world_size,
                   " at ", env.master_addr, ":", env.master_port, " (RANK set twice?); this one (pid ", ::getpid(),
                   ") came second and stops");
}

ACCELERATE_INLINE void check_claims(c10d::Store& store, const ProcessEnvironment& env) {
  for (int r = 0; r < env.world_size; ++r) {
    const auto claims = store.add("claims/" + std::to_string(r), 0);
    ACCELERATE_CHECK(claims == 1, "rendezvous: two processes started as rank ", r, " of ", env.world_size,
                     " at ", env.master_addr, ":", env.master_port, " (RANK set twice?); rank ", env.rank,
                     " stops");
  }
}

ACCELERATE_INLINE void rendezvous_in(c10d::Store& store, const ProcessEnvironment& env,
                                     std::chrono::milliseconds timeout, const std::string& fingerprint) {
  const std::string subject =
      "rendezvous: ranks must be built with the same policies and started with the same shared options";
  claim_rank(store, env);
  wait_for_all(store, "joined", env, fingerprint, timeout, "joining", [&](int r, const std::string& theirs) {
    if (theirs == fingerprint) return;
    // Every rank that arrived differs from someone and fails too; rank 0 serves the store, so
    // it lets them read what they need (bounded) before it exits and takes the store along.
    store.set("rejected/" + std::to_string(env.rank), "1");
    if (env.rank == 0) {
      for (int peer = 1; peer < env.world_size; ++peer) {
        try {
          if (store.check({"joined/" + std::to_string(peer)}))
            store.wait({"rejected/" + std::to_string(peer)}, std::min(timeout, std::chrono::milliseconds(5000)));
        } catch (const std::exception&) {
        }
      }
    }
    accelerate::detail::fail(subject, ": rank ", env.rank, " and rank ", r, " differ: ",
                             detail::first_difference(fingerprint, theirs, r), ". Rank ", env.rank, ": ",
                             fingerprint, "; rank ", r, ": ", theirs);
  });
  check_claims(store, env);
}

}  // namespace accelerate::distributed
