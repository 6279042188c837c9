// Bodies of supervisor.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/launch/supervisor.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ACCELERATE_CHECK(fd >= 0, "accelerate launch: socket(): ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  ACCELERATE_CHECK(ok, "accelerate launch: could not find a free port: ", std::strerror(errno));
  return ntohs(addr.sin_port);
}

ACCELERATE_INLINE std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")";
  }
  return "ended with status " + std::to_string(status);
}

ACCELERATE_INLINE int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

ACCELERATE_INLINE void follow_supervisor() {
  const char* text = std::getenv(supervisor_pid_variable);
  if (!text) return;
  const auto supervisor = static_cast<pid_t>(std::strtol(text, nullptr, 10));
  // Consumed: a program this rank starts is not the supervisor's child and must not compare.
  ::unsetenv(supervisor_pid_variable);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != supervisor) ::raise(SIGKILL);
}

}  // namespace accelerate::detail

namespace accelerate {

ACCELERATE_INLINE int supervise(std::vector<RankProcess>& ranks, int first_rank, double grace_seconds,
                                SupervisionReport* report) {
  struct sigaction action {};
  action.sa_handler = detail::remember_signal;
  sigemptyset(&action.sa_mask);
  struct sigaction old_int {}, old_term {};
  ::sigaction(SIGINT, &action, &old_int);
  ::sigaction(SIGTERM, &action, &old_term);

  for (auto& rank : ranks) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      if (!rank.env.count(entry.substr(0, entry.find('=')))) env_strings.push_back(entry);
    }
    for (const auto& [key, value] : rank.env) env_strings.push_back(key + "=" + value);
    if (!rank.env.count(detail::supervisor_pid_variable))
      env_strings.push_back(std::string(detail::supervisor_pid_variable) + "=" + std::to_string(::getpid()));
    std::vector<char*> envp, argv;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    for (auto& s : rank.argv) argv.push_back(s.data());
    argv.push_back(nullptr);
    const int err = ::posix_spawn(&rank.pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data());
    ACCELERATE_CHECK(err == 0, "accelerate launch: could not start a rank: ", std::strerror(err));
  }

  int result = 0;
  std::size_t running = ranks.size();
  bool stopping = false, forwarded = false;
  auto deadline = std::chrono::steady_clock::time_point::max();
  // When each rank was stopped (SIGSTOP, SIGTSTP, a debugger), while it stays stopped: a peer
  // then fails on a timeout, and the report must name the stuck rank, not the peer.
  std::vector<std::optional<std::pair<int, std::chrono::steady_clock::time_point>>> stopped(ranks.size());
  auto signal_all = [&](int sig) {
    for (auto& r : ranks)
      if (r.pid > 0) ::kill(r.pid, sig);
  };
  while (running > 0) {
    if (const int sig = detail::forwarded_signal.exchange(0)) {
      signal_all(sig);
      forwarded = true;
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG | WUNTRACED | WCONTINUED);
    if (pid > 0) {
      for (std::size_t i = 0; i < ranks.size(); ++i) {
        if (ranks[i].pid != pid) continue;
        if (WIFSTOPPED(status)) {
          stopped[i] = {WSTOPSIG(status), std::chrono::steady_clock::now()};
          continue;
        }
        if (WIFCONTINUED(status)) {
          stopped[i].reset();
          continue;
        }
        ranks[i].pid = -1;
        stopped[i].reset();
        --running;
        const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && !stopping) {
          stopping = true;
          result = detail::exit_code(status);
          if (report) {
            report->failed = i;
            report->failed_by_signal = WIFSIGNALED(status);
          }
          std::cerr << "accelerate launch: rank " << first_rank + static_cast<int>(i) << " (pid " << pid
                    << ") " << detail::describe(status) << "; stopping the other "
                    << running << " rank(s)" << std::endl;
          for (std::size_t j = 0; j < ranks.size(); ++j) {
            if (!stopped[j]) continue;
            const auto [sig, since] = *stopped[j];
            const auto for_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
            std::cerr << "accelerate launch: rank " << first_rank + static_cast<int>(j) << " (pid " << ranks[j].pid
                      << ") has been stopped by signal " << sig << " (" << ::strsignal(sig) << ") for " << for_s
                      << " s: the stuck rank, and the likely cause of rank " << first_rank + static_cast<int>(i)
                      << "'s failure" << std::endl;
          }
          signal_all(SIGTERM);
          signal_all(SIGCONT);  // a stopped rank acts on SIGTERM only once continued
          deadline = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<long>(grace_seconds * 1000));
        }
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (std::chrono::steady_clock::now() > deadline) {
      signal_all(SIGKILL);
      deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (report) report->forwarded_signal = forwarded;
  // After forwarding a signal the job is ending: a second SIGINT/SIGTERM moments after the
  // first (schedulers and impatient users send them) is absorbed rather than turning the
  // ranks' clean exit into the launcher's death by signal.
  if (!forwarded) {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
  }
  return result;
}

}  // namespace accelerate
