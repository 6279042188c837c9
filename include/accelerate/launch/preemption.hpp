// Opt-in preemption handling: SIGTERM and SIGUSR1 (what SLURM sends before preempting a job)
// stop killing the process and instead raise a flag that Accelerator::check_trigger()
// reports on every rank, so the loop can finish its optimizer step, save_state and exit 0.
#pragma once

#include <signal.h>

#include <atomic>
#include <initializer_list>
#include <map>

namespace accelerate {

namespace detail {
inline std::atomic<int> last_signal{0};
inline std::atomic<bool> ever_requested{false};  // not cleared by clear_preemption_request()
inline void on_signal(int sig) {
  last_signal.store(sig);
  ever_requested.store(true);
}
}  // namespace detail

/// Whether a preemption signal arrived since the flag was last cleared.
inline bool preemption_requested() noexcept { return detail::last_signal.load() != 0; }
/// The signal that requested preemption (0 for none).
inline int preemption_signal() noexcept { return detail::last_signal.load(); }
inline void clear_preemption_request() noexcept { detail::last_signal.store(0); }

/// While alive, the given signals request preemption instead of terminating the process.
/// The previous handlers come back when it is destroyed, unless a preemption was requested:
/// the process is then on its way out (saving, exiting), and a second SIGTERM sent moments
/// after the first must not kill it there, so the signals stay absorbed.
/// Example:
///   accelerate::PreemptionGuard guard;   // SIGTERM, SIGUSR1
///   for (auto& [x, y] : loader) {
///     ...; opt.step();
///     if (acc.check_trigger()) { acc.save_state(); return 0; }   // every rank agrees
///   }
class PreemptionGuard {
 public:
  explicit PreemptionGuard(std::initializer_list<int> signals = {SIGTERM, SIGUSR1}) {
    struct sigaction action {};
    action.sa_handler = detail::on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // a signal must not make a blocking collective fail
    for (const int sig : signals) {
      struct sigaction previous {};
      ::sigaction(sig, &action, &previous);
      previous_.emplace(sig, previous);
    }
  }
  ~PreemptionGuard() {
    if (detail::ever_requested.load()) return;
    for (auto& [sig, previous] : previous_) ::sigaction(sig, &previous, nullptr);
  }
  PreemptionGuard(const PreemptionGuard&) = delete;
  PreemptionGuard& operator=(const PreemptionGuard&) = delete;

 private:
  std::map<int, struct sigaction> previous_;
};

}  // namespace accelerate
