// The launcher (launch/): spawning ranks, propagating a failing rank's exit code, stopping the
// others, forwarding signals, joining under an existing launcher, and environment detection.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "../support/build_paths.hpp"
#include "../support/temp_dir.hpp"

namespace {

using accelerate::testing::TempDir;

struct Run {
  int code;
  std::string output;
  double seconds;
};

Run run(const std::string& command) {
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = ::popen(("(" + command + ") 2>&1").c_str(), "r");
  std::string output;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), output,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

std::vector<pid_t> pids(const TempDir& dir, int world) {
  std::vector<pid_t> out;
  for (int r = 0; r < world; ++r) {
    std::ifstream in(dir / ("rank" + std::to_string(r) + ".pid"));
    pid_t pid = -1;
    in >> pid;
    out.push_back(pid);
  }
  return out;
}

bool alive(pid_t pid) { return pid > 0 && ::kill(pid, 0) == 0; }

TEST(Launch, AFailingRankStopsTheOthersAndItsCodeIsReturned) {
  TempDir dir;
  const auto r = run(std::string(ACCELERATE_LAUNCH_PROBE) + " --nproc 3 --fail-rank 1 --code 7 --pid-dir " +
                     dir.path().string());
  EXPECT_EQ(r.code, 7) << r.output;
  EXPECT_LT(r.seconds, 20.0);
  EXPECT_NE(r.output.find("rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with code 7"), std::string::npos) << r.output;
  for (pid_t pid : pids(dir, 3)) EXPECT_FALSE(alive(pid)) << pid;
}

TEST(Launch, SpawnsRanksWithTheirEnvironmentAndSucceeds) {
  TempDir dir;
  const auto r = run(std::string(ACCELERATE_LAUNCH_PROBE) + " --sleep 0.2 --pid-dir " + dir.path().string() +
                     " --nproc=2");
  EXPECT_EQ(r.code, 0) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir / ("rank" + std::to_string(rank) + ".pid"));
    pid_t pid;
    std::string world, threads;
    in >> pid >> world >> threads;
    EXPECT_EQ(world, "2");
    EXPECT_NE(threads, "-");  // OMP_NUM_THREADS set against oversubscription
  }
}

TEST(Launch, ACrashedRankIsReportedWithItsSignal) {
  TempDir dir;
  const auto r = run(std::string(ACCELERATE_LAUNCH_PROBE) + " --nproc 2 --sleep 30 --pid-dir " +
                     dir.path().string() + " & sleep 1; kill -9 $(cut -d' ' -f1 " + (dir / "rank1.pid").string() +
                     "); wait %1");
  EXPECT_EQ(r.code, 128 + SIGKILL) << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("killed by signal 9"), std::string::npos) << r.output;
}

// Starts launch_probe --nproc 2 with ranks that sleep for a minute; returns the launcher's
// pid once both ranks have written theirs.
pid_t start_sleeping_launcher(const TempDir& dir) {
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    ::execl(ACCELERATE_LAUNCH_PROBE, ACCELERATE_LAUNCH_PROBE, "--nproc", "2", "--sleep", "60", "--pid-dir",
            dir.path().c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 200 && !(std::filesystem::exists(dir / "rank0.pid") && std::filesystem::exists(dir / "rank1.pid")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the pid files are complete
  return launcher;
}

TEST(Launch, ForwardsSigtermToEveryRank) {
  TempDir dir;
  const pid_t launcher = start_sleeping_launcher(dir);
  const auto ranks = pids(dir, 2);
  ::kill(launcher, SIGTERM);
  int status = 0;
  ::waitpid(launcher, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM) << status;
  for (pid_t pid : ranks) EXPECT_FALSE(alive(pid));
}

// Running, as opposed to gone or a zombie nobody reaped yet.
bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  const auto close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] != 'Z' && text[close + 2] != 'X';
}

// A launcher killed with SIGKILL (nothing it can forward) takes its ranks with it.
TEST(Launch, RanksDieWithTheirLauncher) {
  TempDir dir;
  const pid_t launcher = start_sleeping_launcher(dir);
  const auto ranks = pids(dir, 2);
  ASSERT_TRUE(running(ranks[0]) && running(ranks[1]));
  ::kill(launcher, SIGKILL);
  ::waitpid(launcher, nullptr, 0);
  bool gone = false;
  for (int i = 0; i < 40 && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gone = !running(ranks[0]) && !running(ranks[1]);
  }
  for (pid_t pid : ranks) {
    EXPECT_FALSE(running(pid)) << "rank pid " << pid << " outlived its launcher by 2 s";
    if (running(pid)) ::kill(pid, SIGKILL);
  }
}

// An exception escaping the rank's function (here an accelerate::Error, as a rendezvous
// error is) is printed and returned as exit code 1; it ended examples/minimal with SIGABRT.
TEST(Launch, AnExceptionInTheRankIsPrintedAndExitsOne) {
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "1", 1);
  char name[] = "probe";
  char* argv[] = {name, nullptr};
  ::testing::internal::CaptureStderr();
  const int code = accelerate::launch(1, argv, [](int, char**) -> int {
    throw accelerate::Error("rendezvous: rank 1 could not reach rank 0's store");
  });
  const std::string printed = ::testing::internal::GetCapturedStderr();
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(name);
  EXPECT_EQ(code, 1);
  EXPECT_NE(printed.find("could not reach rank 0's store"), std::string::npos) << printed;
}

TEST(Launch, JoinsWhenAlreadyUnderALauncher) {
  TempDir dir;
  const auto r = run("RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 " +
                     std::string(ACCELERATE_LAUNCH_PROBE) + " --nproc 4 --sleep 0 --pid-dir " + dir.path().string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir / "rank0.pid"));
  EXPECT_FALSE(std::filesystem::exists(dir / "rank1.pid"));
}

// What each attempt of rank `rank` wrote: "attempt world allow" lines.
std::vector<std::string> attempts(const TempDir& dir, int rank) {
  std::ifstream in(dir / ("env_rank" + std::to_string(rank) + ".txt"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(ElasticLaunch, OneProcessIsRestartedToo) {
  TempDir dir;
  const auto r = run(std::string(ACCELERATE_LAUNCH_PROBE) + " --nproc 1 --max-restarts 2 --fail-rank 0 --code 7 --pid-dir " +
                     dir.path().string());
  EXPECT_EQ(r.code, 7) << r.output;
  EXPECT_NE(r.output.find("restart 2 of 2 with 1 process(es)"), std::string::npos) << r.output;
  EXPECT_EQ(attempts(dir, 0), (std::vector<std::string>{"0 1 -", "1 1 -", "2 1 -"})) << r.output;
}

// A rank that exits with an error code failed in the program (every rank would, again): the job
// keeps its size. One killed by a signal is lost: the job goes on without it, and only then may
// load_state change the world size.
TEST(ElasticLaunch, OnlyARankKilledBySignalShrinksTheJob) {
  TempDir failed, killed;
  const std::string probe = std::string(ACCELERATE_LAUNCH_PROBE) + " --nproc 3 --min-nproc 2 --max-restarts 1 --fail-rank 2";
  const auto error = run(probe + " --code 7 --sleep 2 --pid-dir " + failed.path().string());
  EXPECT_EQ(error.code, 7) << error.output;
  EXPECT_NE(error.output.find("restart 1 of 1 with 3 process(es)"), std::string::npos) << error.output;
  EXPECT_EQ(attempts(failed, 0), (std::vector<std::string>{"0 3 -", "1 3 -"})) << error.output;
  const auto signal = run(probe + " --signal 9 --sleep 2 --pid-dir " + killed.path().string());
  EXPECT_EQ(signal.code, 0) << signal.output;  // the survivors finish
  EXPECT_NE(signal.output.find("restart 1 of 1 with 2 process(es)"), std::string::npos) << signal.output;
  EXPECT_EQ(attempts(killed, 0), (std::vector<std::string>{"0 3 -", "1 2 1"})) << signal.output;
}

TEST(Launch, BadFlagsAreErrors) {
  const auto r = run(std::string(ACCELERATE_LAUNCH_PROBE) + " --nproc zero");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--nproc needs an integer"), std::string::npos) << r.output;
  const auto nodes = run(std::string(ACCELERATE_LAUNCH_PROBE) + " --nnodes 2 --node-rank 1");
  EXPECT_NE(nodes.output.find("needs --master-port"), std::string::npos) << nodes.output;
}

}  // namespace
