// Multi-process tests: a test binary re-runs itself as the ranks of a job (real processes,
// real TCPStore and Gloo on 127.0.0.1). Workers are registered by name; each rank's output
// goes to a log file the test can read.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace accelerate::testing {

/// A worker body, run in every rank; its return value is the process's exit code.
using WorkerFn = std::function<int()>;
std::map<std::string, WorkerFn>& worker_registry();

struct WorkerRegistration {
  WorkerRegistration(const std::string& name, WorkerFn fn) { worker_registry()[name] = std::move(fn); }
};

/// Defines a worker: `ACCELERATE_WORKER(train_two_ranks) { ...; return 0; }`.
#define ACCELERATE_WORKER(name)                                                              \
  static int accelerate_worker_##name();                                                     \
  static const ::accelerate::testing::WorkerRegistration accelerate_worker_registration_##name( \
      #name, accelerate_worker_##name);                                                      \
  static int accelerate_worker_##name()

/// The outcome of one job.
struct JobResult {
  int exit_code = -1;
  double seconds = 0;
  std::filesystem::path dir;              // the job's folder (logs, outputs)
  std::string log(int rank) const;        // what rank `rank` printed
  std::string logs() const;               // all ranks' output
};

/// Options of a job.
struct JobOptions {
  int world_size = 2;
  /// Ranks actually started (default: all); leaving some out tests rendezvous failures.
  std::vector<int> ranks;
  std::map<std::string, std::string> env;  // extra environment for every rank
  std::vector<std::string> args;           // ACCELERATE_TEST_ARGS for the worker
  double grace_seconds = 3.0;
  /// Nodes the ranks are spread over, as LOCAL_RANK/LOCAL_WORLD_SIZE tell them (all on this host).
  int nodes = 1;
};

/// Runs worker `name` as the ranks of a job through accelerate's own supervisor and returns
/// when every rank has exited (a failing rank stops the others).
JobResult run_job(const std::string& name, const JobOptions& options);

/// This worker's job folder (ACCELERATE_TEST_DIR).
std::filesystem::path job_dir();

/// This worker's arguments (JobOptions::args), one per element.
std::vector<std::string> worker_arguments();

/// Saves/loads a tensor as raw float64 (test outputs exchanged between processes).
void save_tensor(const std::filesystem::path& path, const torch::Tensor& t);
torch::Tensor load_tensor(const std::filesystem::path& path);

/// main() of multi-process test binaries: runs a worker when started as one, else GoogleTest.
int multiprocess_main(int argc, char** argv);

}  // namespace accelerate::testing
