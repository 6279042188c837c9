// Bodies of heartbeat.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/distributed/heartbeat.hpp>

namespace accelerate::distributed {

ACCELERATE_INLINE Heartbeat::Heartbeat(const ProcessEnvironment& env, const std::string& prefix,
                                       std::chrono::milliseconds interval)
    : shared_(std::make_shared<Shared>()) {
  shared_->env = env;
  shared_->prefix = prefix;
  shared_->interval = interval;
  std::thread([shared = shared_] { shared->run(); }).detach();
}

ACCELERATE_INLINE Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->stop = true;
  }
  shared_->wake.notify_all();
}

ACCELERATE_INLINE std::string Heartbeat::diagnose() {
  const auto shared = shared_;
  const auto before = query(shared);
  if (!before) return unreachable(*shared);
  std::this_thread::sleep_for(shared->interval * 5 / 2);
  const auto after = query(shared);
  if (!after) return unreachable(*shared);
  std::ostringstream stopped;
  int n = 0;
  for (int r = 0; r < shared->env.world_size; ++r)
    if (r != shared->env.rank && (*after)[static_cast<std::size_t>(r)] == (*before)[static_cast<std::size_t>(r)])
      stopped << (n++ ? ", " : "") << r;
  if (n == 0) return "every rank is still alive (a slow peer, or collectives issued in different orders?)";
  return std::string(n == 1 ? "rank " : "ranks ") + stopped.str() + " stopped responding";
}

ACCELERATE_INLINE std::optional<std::vector<int64_t>> Heartbeat::query(const std::shared_ptr<Shared>& shared) {
  auto promise = std::make_shared<std::promise<std::vector<int64_t>>>();
  auto answer = promise->get_future();
  std::thread([shared, promise] {
    try {
      promise->set_value(shared->counts());
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  }).detach();
  if (answer.wait_for(shared->interval * 4) != std::future_status::ready) return std::nullopt;
  try {
    return answer.get();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace accelerate::distributed
