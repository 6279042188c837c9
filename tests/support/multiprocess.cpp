// Implementation of support/multiprocess.hpp.
#include "multiprocess.hpp"

#include <algorithm>

#include <accelerate/launch/launch.hpp>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

namespace accelerate::testing {

std::map<std::string, WorkerFn>& worker_registry() {
  static std::map<std::string, WorkerFn> registry;
  return registry;
}

std::string JobResult::log(int rank) const {
  std::ifstream in(dir / ("rank" + std::to_string(rank) + ".log"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string JobResult::logs() const {
  std::string all;
  for (int r = 0; r < 64; ++r) {
    if (!std::filesystem::exists(dir / ("rank" + std::to_string(r) + ".log"))) continue;
    all += "--- rank " + std::to_string(r) + " ---\n" + log(r);
  }
  return all;
}

std::filesystem::path job_dir() {
  const char* dir = std::getenv("ACCELERATE_TEST_DIR");
  return dir ? dir : ".";
}

std::vector<std::string> worker_arguments() {
  const char* text = std::getenv("ACCELERATE_TEST_ARGS");  // one per line (run_job)
  std::vector<std::string> lines;
  std::istringstream in(text ? text : "");
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

JobResult run_job(const std::string& name, const JobOptions& options) {
  std::string pattern = (std::filesystem::temp_directory_path() / "accelerate-job-XXXXXX").string();
  JobResult result;
  result.dir = ::mkdtemp(pattern.data());
  std::string args;
  for (const auto& a : options.args) args += a + "\n";
  std::vector<int> ranks = options.ranks;
  if (ranks.empty())
    for (int r = 0; r < options.world_size; ++r) ranks.push_back(r);
  const std::string port = std::to_string(detail::free_port());
  std::vector<RankProcess> processes;
  for (const int rank : ranks) {
    RankProcess p;
    p.argv = {"/proc/self/exe"};
    p.env = options.env;
    p.env["ACCELERATE_TEST_WORKER"] = name;
    p.env["ACCELERATE_TEST_DIR"] = result.dir.string();
    p.env["ACCELERATE_TEST_ARGS"] = args;
    p.env["RANK"] = std::to_string(rank);
    p.env["WORLD_SIZE"] = std::to_string(options.world_size);
    const int per_node = options.world_size / std::max(1, options.nodes);
    p.env["LOCAL_RANK"] = std::to_string(rank % per_node);
    p.env["LOCAL_WORLD_SIZE"] = std::to_string(per_node);
    p.env["MASTER_ADDR"] = "127.0.0.1";
    if (!p.env.count("MASTER_PORT")) p.env["MASTER_PORT"] = port;
    if (!p.env.count("OMP_NUM_THREADS")) p.env["OMP_NUM_THREADS"] = "1";
    processes.push_back(std::move(p));
  }
  const auto start = std::chrono::steady_clock::now();
  result.exit_code = supervise(processes, ranks.front(), options.grace_seconds);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void save_tensor(const std::filesystem::path& path, const torch::Tensor& t) {
  const torch::Tensor flat = t.detach().to(torch::kCPU, torch::kDouble).contiguous().reshape(-1);
  std::ofstream out(path, std::ios::binary);
  const int64_t n = flat.numel();
  out.write(reinterpret_cast<const char*>(&n), sizeof n);
  out.write(reinterpret_cast<const char*>(flat.data_ptr<double>()), static_cast<std::streamsize>(n * 8));
}

torch::Tensor load_tensor(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  int64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), sizeof n);
  if (!in) throw std::runtime_error("load_tensor: cannot read " + path.string());
  torch::Tensor t = torch::empty({n}, torch::kDouble);
  in.read(reinterpret_cast<char*>(t.data_ptr<double>()), static_cast<std::streamsize>(n * 8));
  return t;
}

int multiprocess_main(int argc, char** argv) {
  if (const char* name = std::getenv("ACCELERATE_TEST_WORKER")) {
    detail::follow_supervisor();
    const std::string rank = std::getenv("RANK") ? std::getenv("RANK") : "0";
    const auto log = job_dir() / ("rank" + rank + ".log");
    std::freopen(log.c_str(), "w", stdout);
    std::freopen(log.c_str(), "a", stderr);
    std::setvbuf(stdout, nullptr, _IONBF, 0);
    auto it = worker_registry().find(name);
    if (it == worker_registry().end()) {
      std::cerr << "no worker named " << name << "\n";
      return 99;
    }
    try {
      return it->second();
    } catch (const std::exception& e) {
      std::cerr << "worker " << name << " rank " << rank << " threw: " << e.what() << std::endl;
      return 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace accelerate::testing
