// Tests of include/accelerate/distributed/process_environment.hpp and launch/cli.hpp: reading
// torchrun, Open MPI and SLURM variables, and the launcher's flags.
#include <accelerate/distributed/process_environment.hpp>
#include <accelerate/launch/cli.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace {

using accelerate::distributed::detect_environment;

// Sets variables for one test and restores the previous environment afterwards.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& vars) {
    for (const char* name : kAll) {
      if (const char* v = std::getenv(name)) saved_[name] = v;
      ::unsetenv(name);
    }
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const char* name : kAll) ::unsetenv(name);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  static constexpr const char* kAll[] = {
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
      "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
      "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
      "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_JOB_ID",
      "ACCELERATE_NUM_PROCESSES"};
  std::map<std::string, std::string> saved_;
};

std::string error_of(const std::map<std::string, std::string>& vars) {
  ScopedEnv env(vars);
  try {
    detect_environment();
  } catch (const accelerate::Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Environment, NoVariablesMeansOneProcess) {
  ScopedEnv env({});
  const auto e = detect_environment();
  EXPECT_FALSE(e.launched());
  EXPECT_EQ(e.world_size, 1);
}

TEST(Environment, ReadsTorchrun) {
  ScopedEnv env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"}});
  const auto e = detect_environment();
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 29400);
}

TEST(Environment, ReadsOpenMpiAndSlurm) {
  {
    ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                   {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}});
    const auto e = detect_environment();
    EXPECT_EQ(e.source, "openmpi");
    EXPECT_EQ(e.rank, 5);
    EXPECT_EQ(e.local_world_size, 4);
  }
  {
    ScopedEnv env({{"SLURM_PROCID", "2"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_LOCALID", "0"},
                   {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}, {"SLURM_STEP_NODELIST", "gpu[07-08]"},
                   {"SLURM_JOB_ID", "4242"}});
    const auto e = detect_environment();
    EXPECT_EQ(e.source, "slurm");
    EXPECT_EQ(e.rank, 2);
    EXPECT_EQ(e.world_size, 4);
    EXPECT_EQ(e.local_world_size, 2);
    EXPECT_EQ(e.master_addr, "gpu07");
    EXPECT_EQ(e.master_port, 24242);
  }
  {  // an sbatch script (no srun step) is one process
    ScopedEnv env({{"SLURM_PROCID", "0"}, {"SLURM_JOB_ID", "1"}});
    EXPECT_FALSE(detect_environment().launched());
  }
}

TEST(Environment, PartialOrInconsistentVariablesAreNamed) {
  EXPECT_NE(error_of({{"RANK", "0"}}).find("WORLD_SIZE is missing"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}).find("MASTER_ADDR"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "a"},
                      {"MASTER_PORT", "1"}})
                .find("rank 2 is not below the world size 2"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "x"}}).find("RANK='x' is not a non-negative integer"), std::string::npos);
  EXPECT_NE(error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})
                .find("mpirun -x MASTER_ADDR"),
            std::string::npos);
}

TEST(LaunchArgs, LauncherFlagsAreRemovedFromArgv) {
  ScopedEnv env({});
  std::string a0 = "prog", a1 = "--epochs", a2 = "3", a3 = "--nproc", a4 = "2", a5 = "--master-port=1234", a6 = "x";
  char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), a4.data(), a5.data(), a6.data(), nullptr};
  int argc = 7;
  const auto o = accelerate::parse_launch_args(argc, argv);
  EXPECT_EQ(o.nproc, 2);
  EXPECT_EQ(o.master_port, 1234);
  ASSERT_EQ(argc, 4);
  EXPECT_EQ(std::string(argv[1]), "--epochs");
  EXPECT_EQ(std::string(argv[2]), "3");
  EXPECT_EQ(std::string(argv[3]), "x");
  EXPECT_EQ(argv[4], nullptr);
}

TEST(LaunchArgs, RestartFlagsAndTheirLimits) {
  ScopedEnv env({});
  auto parse = [](std::vector<std::string> args) {
    args.insert(args.begin(), "prog");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int argc = static_cast<int>(args.size());
    return accelerate::parse_launch_args(argc, argv.data());
  };
  const auto o = parse({"--nproc", "3", "--max-restarts", "2", "--min-nproc=2"});
  EXPECT_EQ(o.max_restarts, 2);
  EXPECT_EQ(o.min_nproc, 2);
  EXPECT_EQ(parse({"--nproc", "3"}).max_restarts, 0);
  EXPECT_FALSE(parse({"--nproc", "3"}).min_nproc.has_value());
  auto refusal = [&](std::vector<std::string> args) {
    try {
      parse(std::move(args));
    } catch (const accelerate::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(refusal({"--nproc", "2", "--min-nproc", "3"}).find("--min-nproc 3 is above --nproc 2"), std::string::npos);
  EXPECT_NE(refusal({"--nproc", "2", "--nnodes", "2", "--master-port", "1", "--max-restarts", "1"})
                .find("restart a one-node job"),
            std::string::npos);
  EXPECT_NE(refusal({"--max-restarts", "-1"}).find("--max-restarts needs an integer"), std::string::npos);
}

}  // namespace
