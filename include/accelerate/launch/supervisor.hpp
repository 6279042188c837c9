// Supervisor: starts the ranks of one node as child processes, forwards SIGINT/SIGTERM, and
// when a rank fails stops the others and reports which rank failed and how.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/launch/cli.hpp>

extern char** environ;

namespace accelerate {

namespace detail {

inline std::atomic<int> forwarded_signal{0};
inline void remember_signal(int sig) { forwarded_signal.store(sig); }

/// A TCP port that was free a moment ago (the kernel's choice for port 0 on loopback).
int free_port();

std::string describe(int status);

/// The exit code a failed rank propagates: its own, or 128 + signal as shells do.
int exit_code(int status);

/// The variable through which a rank learns its supervisor's pid.
inline constexpr const char* supervisor_pid_variable = "ACCELERATE_SUPERVISOR_PID";

/// In a rank started by supervise(): die at once (SIGKILL) when the supervisor dies, so no rank
/// outlives a launcher killed with SIGKILL. A supervisor already gone before the request was
/// made (the race PR_SET_PDEATHSIG leaves) is caught by comparing the parent's pid.
void follow_supervisor();

}  // namespace detail

/// One rank to start: its command line and the variables added to this process's environment.
struct RankProcess {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  pid_t pid = -1;
};

/// What supervise() saw, for a launcher deciding whether to restart the job.
struct SupervisionReport {
  /// Index (in the list given) of the rank whose failure ended the job; none when all exited 0.
  std::optional<std::size_t> failed;
  /// Whether that rank died of a signal (killed, out of memory, a crash) rather than exiting
  /// with an error code.
  bool failed_by_signal = false;
  /// Whether a SIGINT or SIGTERM was forwarded to the ranks (the job was asked to end).
  bool forwarded_signal = false;
};

/// Starts the ranks and waits for them. Returns 0 when all exit 0; otherwise the first
/// failing rank's code (128 + signal when killed), after terminating the others (SIGTERM,
/// then SIGKILL after `grace_seconds`). Prints one line naming the failing rank to stderr.
/// SIGINT and SIGTERM sent to the supervisor are forwarded to every rank. Ranks that call
/// detail::follow_supervisor() (accelerate::launch does) die with the supervisor. `report`,
/// when given, receives which rank failed first and whether a signal was forwarded.
int supervise(std::vector<RankProcess>& ranks, int first_rank, double grace_seconds,
              SupervisionReport* report = nullptr);

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/launch/supervisor.ipp>
#endif
