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
///   - with --max-restarts K, a failed job is started again up to K times (every rank
///     restarted, on a new port; ACCELERATE_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT tell
///     the ranks which attempt they are), also with --nproc 1; with --min-nproc M below N a
///     rank that died of a signal (killed, out of memory, a crash) counts as lost and the job
///     restarts on the survivors, never fewer than M, with ACCELERATE_ALLOW_WORLD_SIZE_CHANGE=1
///     so that load_state() reshards the checkpoint (only once the job has shrunk). A rank that
///     exited with an error code failed in the program, as every rank would again: the job
///     restarts at its size. A job ended by SIGINT/SIGTERM is not restarted;
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
  if (world == 1 && options.max_restarts == 0) return run();

  try {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const int min_nproc = options.min_nproc.value_or(options.nproc);
    const bool elastic = min_nproc < options.nproc;
    int nproc = options.nproc;
    for (int attempt = 0;; ++attempt) {
      const int port = options.master_port ? *options.master_port : detail::free_port();
      std::vector<RankProcess> ranks;
      for (int local = 0; local < nproc; ++local) {
        RankProcess r;
        r.argv.assign(argv, argv + argc);
        const int rank = options.node_rank * nproc + local;
        r.env = {{"RANK", std::to_string(rank)},
                 {"WORLD_SIZE", std::to_string(nproc * options.nnodes)},
                 {"LOCAL_RANK", std::to_string(local)},
                 {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
                 {"GROUP_RANK", std::to_string(options.node_rank)},
                 {"MASTER_ADDR", options.master_addr},
                 {"MASTER_PORT", std::to_string(port)}};
        if (options.max_restarts > 0) {
          r.env["ACCELERATE_RESTART_COUNT"] = r.env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(attempt);
          r.env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(options.max_restarts);
        }
        if (nproc != options.nproc) r.env["ACCELERATE_ALLOW_WORLD_SIZE_CHANGE"] = "1";  // it shrank
        if (!detail::env_string("OMP_NUM_THREADS"))
          r.env["OMP_NUM_THREADS"] = std::to_string(std::max(1u, cores / static_cast<unsigned>(nproc)));
        ranks.push_back(std::move(r));
      }
      SupervisionReport report;
      const int code = supervise(ranks, options.node_rank * nproc, options.grace_seconds, &report);
      if (code == 0 || report.forwarded_signal || attempt >= options.max_restarts) return code;
      const bool lost = report.failed && report.failed_by_signal;
      const int next = elastic && lost ? nproc - 1 : nproc;
      if (next < min_nproc) {
        std::cerr << "accelerate launch: not restarting: " << next << " process(es) would remain, below --min-nproc "
                  << min_nproc << std::endl;
        return code;
      }
      std::cerr << "accelerate launch: restart " << attempt + 1 << " of " << options.max_restarts << " with " << next
                << " process(es)" << (next < nproc ? " (the failed rank is left out)" : "") << std::endl;
      nproc = next;
    }
  } catch (const Error& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}

}  // namespace accelerate
