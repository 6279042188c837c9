// The launcher's command-line flags (--nproc, --nnodes, --node-rank, --master-addr,
// --master-port, --max-restarts, --min-nproc), removed from argv before the program sees it.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/env.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate {

/// How accelerate::launch starts a job (flags win over ACCELERATE_NUM_PROCESSES).
struct LaunchOptions {
  int nproc = 1;                        // processes on this node
  int nnodes = 1;                       // nodes in the job
  int node_rank = 0;                    // this node's index
  std::string master_addr = "127.0.0.1";
  std::optional<int> master_port;       // default: a free port (one node) or 29500
  /// Seconds the other ranks get to exit after a rank fails, before SIGKILL.
  double grace_seconds = 5.0;
  /// Times the job is started again after a rank fails (torchrun's --max-restarts). A program
  /// that calls load_state() at start resumes from its latest complete checkpoint.
  int max_restarts = 0;
  /// Fewest processes a restarted job may run with (--min-nproc; default --nproc). Below
  /// --nproc, a rank that failed counts as lost (a dead device or core) and the job restarts
  /// without it, its checkpoint resharded to the survivors; at --nproc every restart runs all
  /// processes, as torchrun's do. A restart that would go below it is not made.
  std::optional<int> min_nproc;
};

namespace detail {

int parse_int(std::string_view flag, const std::string& text, int min, int max);

}  // namespace detail

/// Reads and removes the launcher's flags from argv (both `--flag value` and `--flag=value`),
/// leaving the program's own arguments in order. ACCELERATE_NUM_PROCESSES gives the default
/// --nproc.
/// Example:
///   auto options = accelerate::parse_launch_args(argc, argv);   // argc/argv shrink
LaunchOptions parse_launch_args(int& argc, char** argv);

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/launch/cli.ipp>
#endif
