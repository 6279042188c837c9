// Tests of include/accelerate/distributed/heartbeat.hpp with a real c10d TCPStore: the
// heartbeat's own store connection is made by its thread, so a store that is not up yet (or slow
// to accept one more client on a loaded host) neither fails nor delays start-up.
#include <accelerate/distributed/heartbeat.hpp>
#include <accelerate/launch/supervisor.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace {

using namespace std::chrono_literals;

TEST(Heartbeat, StartsBeforeTheStoreAnswersAndBeatsOnceItDoes) {
  accelerate::distributed::ProcessEnvironment env;
  env.rank = 1;
  env.world_size = 2;
  env.master_port = accelerate::detail::free_port();
  // Nothing listens on the port yet: constructing must not throw (it did after 5 s).
  accelerate::distributed::Heartbeat heartbeat(env, "test", 100ms);
  const auto server = accelerate::compat::make_tcp_store(env.master_addr, env.master_port, /*is_server=*/true,
                                                         env.world_size, 10s);
  std::int64_t beats = 0;
  for (int attempt = 0; attempt < 300 && beats == 0; ++attempt) {
    beats = server->add("test/beat/1", 0);
    if (beats == 0) std::this_thread::sleep_for(50ms);
  }
  EXPECT_GT(beats, 0) << "the heartbeat never reached the store once it was up";
}

}  // namespace
