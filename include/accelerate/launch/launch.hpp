// accelerate::launch: run a program as N data-parallel processes, like `accelerate launch` or
// torchrun, from inside the program itself.
#pragma once

#include <algorithm>
#include <iostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <accelerate/detail/env.hpp>
#include <accelerate/distributed/process_environment.hpp>
#include <accelerate/launch/cli.hpp>
#include <accelerate/launch/supervisor.hpp>

namespace accelerate {

/// Runs `fn(argc, argv)` as this job's ranks and returns the exit code:
///   - under torchrun, mpirun or srun (rank variables present) it joins: fn runs once, here;
///   - with --nproc N (or ACCELERATE_NUM_PROCESSES) and no rank variables, it starts N copies
///     of this program with torchrun's variables set and a free MASTER_PORT, forwards
///     SIGINT/SIGTERM, and when a rank fails stops the others and returns that rank's code;
///   - multi-node: run it on every node with --nnodes, --node-rank, --master-addr, --master-port;
///   - otherwise fn runs once as a single process.
/// The launcher's flags are removed from argv before fn sees it. Ranks get OMP_NUM_THREADS =
/// cores / nproc unless it is set, so they do not oversubscribe the CPU. An exception escaping
/// fn (a rendezvous error, say) is printed and makes the exit code 1, rather than ending the
/// process with SIGABRT.
/// Example:
///   int main(int argc, char** argv) {
///     return accelerate::launch(argc, argv, [](int argc, char** argv) { return train(argc, argv); });
///   }
template <class Fn>
int launch(int argc, char** argv, Fn&& fn) {
  LaunchOptions options;
  distributed::ProcessEnvironment env;
  try {
    options = parse_launch_args(argc, argv);
    env = distributed::detect_environment();
  } catch (const Error& e) {
    std::cerr << e.what() << std::endl;
    return 2;
  }
  const int world = options.nproc * options.nnodes;
  auto run = [&]() -> int {
    try {
      return std::forward<Fn>(fn)(argc, argv);
    } catch (const std::exception& e) {
      std::cerr << "accelerate: " << e.what() << std::endl;
      return 1;
    }
  };
  if (env.launched()) {
    detail::follow_supervisor();  // a rank of our own launcher dies with it
    return run();
  }
  if (world == 1) return run();

  try {
    const int port = options.master_port ? *options.master_port : detail::free_port();
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    std::vector<RankProcess> ranks;
    for (int local = 0; local < options.nproc; ++local) {
      RankProcess r;
      r.argv.assign(argv, argv + argc);
      const int rank = options.node_rank * options.nproc + local;
      r.env = {{"RANK", std::to_string(rank)},
               {"WORLD_SIZE", std::to_string(world)},
               {"LOCAL_RANK", std::to_string(local)},
               {"LOCAL_WORLD_SIZE", std::to_string(options.nproc)},
               {"GROUP_RANK", std::to_string(options.node_rank)},
               {"MASTER_ADDR", options.master_addr},
               {"MASTER_PORT", std::to_string(port)}};
      if (!detail::env_string("OMP_NUM_THREADS"))
        r.env["OMP_NUM_THREADS"] = std::to_string(std::max(1u, cores / static_cast<unsigned>(options.nproc)));
      ranks.push_back(std::move(r));
    }
    return supervise(ranks, options.node_rank * options.nproc, options.grace_seconds);
  } catch (const Error& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}

}  // namespace accelerate
