// Reliability: each promise comes with a test that tries to break it — ranks that die, saves
// killed at random moments, training killed and resumed, preemption signals, mismatched
// ranks, and two hosts (network namespaces) whose link goes down.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <map>
#include <set>
#include <chrono>
#include <fstream>
#include <random>
#include <thread>

#include "../support/build_paths.hpp"
#include "../support/errors.hpp"
#include "../support/models.hpp"
#include "../support/multiprocess.hpp"
#include "../support/temp_dir.hpp"

extern char** environ;

namespace {

using namespace std::chrono_literals;
using accelerate::testing::TempDir;
using Clock = std::chrono::steady_clock;

// --- processes -----------------------------------------------------------------------------

struct Process {
  pid_t pid = -1;
  std::filesystem::path log;
};

// Starts `argv` with extra environment, output to `log`, in a process group of its own.
Process spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
              const std::filesystem::path& log) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    if (!env.count(entry.substr(0, entry.find('=')))) env_strings.push_back(entry);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  Process p;
  p.log = log;
  const int rc = posix_spawn(&p.pid, args[0], &actions, &attributes, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (rc != 0) throw std::runtime_error("spawn failed");
  return p;
}

// Waits up to `limit`; returns the exit status (128 + signal when killed), or -1 on timeout
// (the process group is then killed).
int wait_for(const Process& p, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  int status = 0;
  while (Clock::now() < deadline) {
    const pid_t done = ::waitpid(p.pid, &status, WNOHANG);
    if (done == p.pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(20ms);
  }
  ::kill(-p.pid, SIGKILL);
  ::waitpid(p.pid, &status, 0);
  return -1;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

std::vector<std::string> trainer(std::vector<std::string> args) {
  args.insert(args.begin(), ACCELERATE_TRAINER);
  return args;
}

// The trainer's command line: arguments shared by a test's runs, then this run's.
std::vector<std::string> trainer(std::vector<std::string> common, const std::vector<std::string>& extra) {
  common.insert(common.end(), extra.begin(), extra.end());
  return trainer(std::move(common));
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::mt19937 random_engine() {
  const auto seed = static_cast<unsigned>(std::random_device{}());
  std::cout << "random seed " << seed << std::endl;
  return std::mt19937(seed);
}

// --- rank failure ----------------------------------------------------------------------------

TEST(RankFailure, TheLauncherStopsEveryRankAndNamesTheFailedOne) {
  TempDir dir;
  for (const auto& [how, code] : {std::pair{"kill", 128 + SIGKILL}, std::pair{"abort", 128 + SIGABRT}}) {
    const auto start = Clock::now();
    const auto p = spawn(trainer({"--nproc", "3", "--out", dir.path().string(), "--timeout", "10", "--steps", "200",
                                  "--die-rank", "1", "--die-step", "5", "--die-how", how}),
                         {}, dir / "launcher.log");
    EXPECT_EQ(wait_for(p, 60s), code) << read_file(p.log);
    EXPECT_LT(seconds_since(start), 20.0);
    EXPECT_NE(read_file(p.log).find("accelerate launch: rank 1 (pid"), std::string::npos) << read_file(p.log);
  }
}

// A rank stopped by SIGSTOP makes its peers fail on the timeout; the launcher must name the
// stuck rank as the cause, not only the healthy one that exited first.
TEST(RankFailure, TheLauncherNamesAStoppedRankAsTheCause) {
  TempDir dir;
  const auto job = spawn(trainer({"--nproc", "3", "--out", dir.path().string(), "--timeout", "5", "--steps", "100000",
                                  "--step-ms", "5"}),
                         {}, dir / "launcher.log");
  for (int i = 0; i < 500 && !std::filesystem::exists(dir / "rank1.pid"); ++i) std::this_thread::sleep_for(20ms);
  std::this_thread::sleep_for(1500ms);
  pid_t rank1 = 0;
  std::ifstream(dir / "rank1.pid") >> rank1;
  ASSERT_GT(rank1, 0);
  ::kill(rank1, SIGSTOP);
  EXPECT_NE(wait_for(job, 60s), 0) << read_file(job.log);
  const auto log = read_file(job.log);
  EXPECT_NE(log.find("rank 1 (pid " + std::to_string(rank1) + ") has been stopped by signal " + std::to_string(SIGSTOP)),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("the likely cause"), std::string::npos) << log;
}

// Without a supervisor (several hosts, or a launcher that does not stop the rest), the
// survivors notice by themselves within the timeout and name the rank that stopped.
void expect_survivors_name(int dead_rank, const std::string& expected, std::vector<std::string> extra = {}) {
  TempDir dir;
  const std::string port = std::to_string(accelerate::detail::free_port());
  std::vector<Process> ranks;
  const auto start = Clock::now();
  std::vector<std::string> args{"--out", dir.path().string(), "--timeout", "10", "--steps", "400", "--step-ms", "10",
                                "--die-rank", std::to_string(dead_rank), "--die-step", "5"};
  args.insert(args.end(), extra.begin(), extra.end());
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(spawn(trainer(args),
                          {{"RANK", std::to_string(r)}, {"WORLD_SIZE", "3"}, {"LOCAL_RANK", std::to_string(r)},
                           {"LOCAL_WORLD_SIZE", "3"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port},
                           {"OMP_NUM_THREADS", "1"}},
                          dir / ("rank" + std::to_string(r) + ".log")));
  }
  for (int r = 0; r < 3; ++r) {
    const int code = wait_for(ranks[static_cast<std::size_t>(r)], 60s);
    const auto log = read_file(ranks[static_cast<std::size_t>(r)].log);
    if (r == dead_rank) {
      EXPECT_EQ(code, 128 + SIGKILL) << log;
      continue;
    }
    EXPECT_NE(code, 0) << "rank " << r << ":\n" << log;
    EXPECT_NE(code, -1) << "rank " << r << " hung:\n" << log;
    EXPECT_NE(log.find(expected), std::string::npos) << "rank " << r << ":\n" << log;
  }
  EXPECT_LT(seconds_since(start), 10.0 + 25.0) << "every survivor exits within the timeout (plus start-up)";
}

TEST(RankFailure, SurvivorsWithoutALauncherNameTheRankThatDied) {
  expect_survivors_name(1, "rank 1 stopped responding");
}

TEST(RankFailure, SurvivorsNameTheStoreHostWhenRankZeroDies) {
  expect_survivors_name(0, "rank 0's rendezvous store at 127.0.0.1:");
}

// Sharded: the survivors are inside a gradient reduce-scatter (stage 2, the rank died before
// its backward) or a parameter all-gather (stage 1, it died before its optimizer step).
TEST(RankFailure, ShardedSurvivorsNameTheRankThatDiedInsideAReduceScatter) {
  expect_survivors_name(1, "gradient reduce_scatter failed on rank", {"--zero", "2"});
}

TEST(RankFailure, ShardedSurvivorsNameTheRankThatDiedInsideAnAllGather) {
  expect_survivors_name(1, "parameter all_gather failed on rank", {"--zero", "1", "--die-before", "step"});
}

// --- crash during save -----------------------------------------------------------------------

// Saves checkpoint after checkpoint of a ~16 MB model whose parameters all equal the
// checkpoint's number, until killed. With "async" in ACCELERATE_TEST_ARGS the saves are
// asynchronous and the parameters are overwritten as soon as save_state returns (training goes
// on while the writer runs), so a checkpoint holding anything but its number would show that
// the writer read live state.
ACCELERATE_WORKER(save_forever) {
  const char* args = std::getenv("ACCELERATE_TEST_ARGS");
  const bool async = args && std::string(args).find("async") != std::string::npos;
  accelerate::Accelerator<> acc{{.cpu = true,
                                 .project = {.project_dir = accelerate::testing::job_dir(),
                                             .automatic_checkpoint_naming = true, .total_limit = 3}}};
  accelerate::testing::TinyNet net(1024, 4096, 4);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));
  auto [model, opt] = acc.prepare(net, sgd);
  auto fill = [&](double value) {
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) p.fill_(value);
  };
  for (;;) {
    fill(static_cast<double>(acc.project_configuration().iteration));
    acc.save_state(std::nullopt, {.asynchronous = async});
    if (async) fill(-1.0);
  }
}

// SIGKILL at 20 random moments of a save loop: the latest complete checkpoint always loads
// and holds its own number, as does every folder named like a checkpoint.
void expect_crashes_never_cost_a_checkpoint(const std::string& mode) {
  auto engine = random_engine();
  std::uniform_int_distribution<int> delay_ms(150, 1500);
  int killed_mid_save = 0;
  for (int trial = 0; trial < 20; ++trial) {
    TempDir dir;
    const auto p = spawn({"/proc/self/exe"},
                         {{"ACCELERATE_TEST_WORKER", "save_forever"}, {"ACCELERATE_TEST_DIR", dir.path().string()},
                          {"ACCELERATE_TEST_ARGS", mode}},
                         dir / "worker.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(engine)));
    ::kill(p.pid, SIGKILL);
    ASSERT_EQ(wait_for(p, 30s), 128 + SIGKILL);
    if (!std::filesystem::exists(dir / "checkpoints")) continue;  // killed before the first save began
    for (const auto& entry : std::filesystem::directory_iterator(dir / "checkpoints"))
      killed_mid_save += entry.path().filename().string().ends_with(".incomplete");

    const auto complete = accelerate::checkpoint::list_checkpoints(dir / "checkpoints");
    if (complete.empty()) continue;  // killed before the first save finished
    accelerate::Accelerator<> acc{{.cpu = true,
                                   .project = {.project_dir = dir.path(), .automatic_checkpoint_naming = true}}};
    accelerate::testing::TinyNet net(1024, 4096, 4);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));
    auto [model, opt] = acc.prepare(net, sgd);
    const auto loaded = acc.load_state();
    EXPECT_EQ(loaded, complete.back().second);
    const double expected = static_cast<double>(complete.back().first);
    for (const auto& param : net->parameters()) {
      EXPECT_TRUE(torch::equal(param, torch::full_like(param, expected))) << "trial " << trial << ": " << loaded;
    }
    // Every folder named like a checkpoint is complete and consistent, not only the latest.
    for (const auto& entry : std::filesystem::directory_iterator(dir / "checkpoints")) {
      const auto number = accelerate::checkpoint::checkpoint_number(entry.path().filename().string());
      if (!number) continue;
      acc.load_state(entry.path());
      EXPECT_EQ(net->fc1->weight[0][0].item<double>(), static_cast<double>(*number)) << entry.path();
    }
  }
  std::cout << "killed in the middle of a " << mode << " save in " << killed_mid_save << " of 20 trials" << std::endl;
  EXPECT_GT(killed_mid_save, 0) << "the kills should land inside save_state at least sometimes";
}

TEST(CrashDuringSave, TheLatestCompleteCheckpointAlwaysLoadsAndIsIntact) {
  expect_crashes_never_cost_a_checkpoint("sync");
}

TEST(CrashDuringSave, AsynchronousSavesToo) { expect_crashes_never_cost_a_checkpoint("async"); }

// A full disk during an asynchronous write (a file-size limit stands in for it: writes past
// 1 MB fail with EFBIG): the next call raises the writer's error naming the file, the failed
// checkpoint never appears, and the previous one loads intact.
ACCELERATE_WORKER(async_save_disk_full) {
  accelerate::Accelerator<> acc{{.cpu = true,
                                 .project = {.project_dir = accelerate::testing::job_dir(),
                                             .automatic_checkpoint_naming = true}}};
  accelerate::testing::TinyNet net(1024, 4096, 4);  // a 16.8 MB weight
  auto [model] = acc.prepare(net);
  auto fill = [&](double value) {
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) p.fill_(value);
  };
  fill(1);
  acc.save_state();  // checkpoint_0, complete
  fill(2);
  ::signal(SIGXFSZ, SIG_IGN);
  rlimit limit{};
  ::getrlimit(RLIMIT_FSIZE, &limit);
  const rlimit full{1 << 20, limit.rlim_max};
  ::setrlimit(RLIMIT_FSIZE, &full);
  acc.save_state(std::nullopt, {.asynchronous = true});  // checkpoint_1: its writer fails
  std::string problems;
  const auto error = accelerate::testing::error_of([&] { acc.save_state(); });
  ::setrlimit(RLIMIT_FSIZE, &limit);
  std::cerr << "the next call said: " << error << "\n";
  for (const char* part : {"save_state (asynchronous) of", "checkpoint_1", "model.safetensors", "File too large"})
    if (error.find(part) == std::string::npos) problems += std::string("the error does not name '") + part + "'; ";
  const auto complete = accelerate::checkpoint::list_checkpoints(accelerate::testing::job_dir() / "checkpoints");
  if (complete.size() != 1 || complete[0].first != 0) problems += "checkpoint_0 should be the only complete one; ";
  fill(5);
  acc.load_state();
  for (const auto& p : net->parameters())
    if (!torch::equal(p, torch::full_like(p, 1.0))) problems += "checkpoint_0 did not load intact; ";
  std::cerr << problems << "\n";
  return problems.empty() ? 0 : 3;
}

TEST(CrashDuringSave, AFullDiskDuringAnAsynchronousSaveIsReportedAndCostsNothing) {
  TempDir dir;
  const auto p = spawn({"/proc/self/exe"},
                       {{"ACCELERATE_TEST_WORKER", "async_save_disk_full"}, {"ACCELERATE_TEST_DIR", dir.path().string()}},
                       dir / "worker.log");
  const int code = wait_for(p, 120s);
  std::ifstream log(dir / "worker.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_EQ(code, 0) << text;
}

// Replaces a sharded model (2 shards of ~16 MB and the index) in one folder, over and over,
// every parameter equal to the save's number, until killed. The folder also holds a file of
// the user's that every save must keep.
ACCELERATE_WORKER(save_model_forever) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  accelerate::testing::TinyNet net(1024, 4096, 1024);  // fc1 and fc2 weights of 16.8 MB each
  auto [model] = acc.prepare(net);
  const auto folder = accelerate::testing::job_dir() / "model";
  std::filesystem::create_directories(folder);
  std::ofstream(folder / "config.json") << "{\"hidden\": 4096}\n";
  for (int n = 1;; ++n) {
    {
      torch::NoGradGuard no_grad;
      for (auto& p : net->parameters()) p.fill_(static_cast<double>(n));
    }
    acc.save_model(model, folder, {.max_shard_size = std::string("17MB")});
  }
}

TEST(CrashDuringSaveModel, TheFolderHoldsTheOldModelOrTheNewNeverAMix) {
  auto engine = random_engine();
  std::uniform_int_distribution<int> delay_ms(300, 2500);
  int loaded = 0;
  for (int trial = 0; trial < 20; ++trial) {
    TempDir dir;
    const auto p = spawn({"/proc/self/exe"},
                         {{"ACCELERATE_TEST_WORKER", "save_model_forever"}, {"ACCELERATE_TEST_DIR", dir.path().string()}},
                         dir / "worker.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(engine)));
    ::kill(p.pid, SIGKILL);
    ASSERT_EQ(wait_for(p, 30s), 128 + SIGKILL);
    const auto folder = dir / "model";
    if (!std::filesystem::exists(folder / "model.safetensors.index.json")) continue;  // before the first save
    accelerate::testing::TinyNet net(1024, 4096, 1024);
    accelerate::load_checkpoint_in_model(*net, folder);  // throws on a mix
    const double value = net->fc1->weight[0][0].item<double>();
    for (const auto& param : net->parameters())
      EXPECT_TRUE(torch::equal(param, torch::full_like(param, value))) << "trial " << trial << ": a mix of saves";
    EXPECT_TRUE(std::filesystem::exists(folder / "config.json")) << "the user's file is kept";
    ++loaded;
  }
  std::cout << "a complete model loaded after " << loaded << " of 20 kills" << std::endl;
  EXPECT_GT(loaded, 10);
}

// --- kill and resume -------------------------------------------------------------------------

TEST(KillAndResume, FinishesWithTheModelOfAnUninterruptedRun) {
  TempDir dir;
  const std::vector<std::string> common = {"--nproc", "2", "--steps", "60", "--step-ms", "30", "--checkpoint-every", "5"};
  auto with = [&](const std::vector<std::string>& extra) { return trainer(common, extra); };
  const auto straight = spawn(with({"--out", (dir / "straight").string()}), {}, dir / "straight.log");
  ASSERT_EQ(wait_for(straight, 120s), 0) << read_file(straight.log);
  const auto expected = read_file(dir / "straight" / "model" / "model.safetensors");
  ASSERT_FALSE(expected.empty());

  auto engine = random_engine();
  std::uniform_int_distribution<int> delay_ms(800, 2500);
  for (int trial = 0; trial < 5; ++trial) {
    const auto out = dir / ("trial" + std::to_string(trial));
    const auto project = (out / "project").string();
    const auto killed = spawn(with({"--out", out.string(), "--project", project}), {}, dir / "killed.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(engine)));
    ::kill(-killed.pid, SIGKILL);  // the whole job at once, as a node crash would
    wait_for(killed, 30s);
    ASSERT_FALSE(std::filesystem::exists(out / "model")) << "killed too late to test anything";
    const auto resumed = spawn(with({"--out", out.string(), "--project", project}), {}, dir / "resumed.log");
    ASSERT_EQ(wait_for(resumed, 120s), 0) << read_file(resumed.log);
    EXPECT_TRUE(read_file(out / "model" / "model.safetensors") == expected) << "trial " << trial;
  }
}

// --- elastic restart ---------------------------------------------------------------------------

// "epoch step index" lines a trainer run logged (--log-samples), from every rank of one attempt.
std::vector<std::array<int64_t, 3>> logged_samples(const std::filesystem::path& out, int ranks, int attempt) {
  std::vector<std::array<int64_t, 3>> lines;
  for (int r = 0; r < ranks; ++r) {
    std::ifstream in(out / ("seen_rank" + std::to_string(r) + "_attempt" + std::to_string(attempt) + ".txt"));
    for (std::array<int64_t, 3> line{}; in >> line[0] >> line[1] >> line[2];) lines.push_back(line);
  }
  return lines;
}

// 3 ranks, 96 samples in batches of 8: 4 steps per epoch (6 on 2 ranks), a checkpoint every 2
// steps. Rank 1 dies at step 7, mid-epoch 1, after the checkpoint of step 6 (48 of the epoch's
// samples consumed). The launcher restarts the job once on the 2 survivors, which reshard that
// checkpoint and finish at step 15, the end of epoch 2.
TEST(ElasticRestart, ALostRankRestartsTheJobOnTheSurvivorsFromItsLastCheckpoint) {
  TempDir dir;
  const std::vector<std::string> common = {"--samples", "96", "--checkpoint-every", "2", "--log-samples"};
  auto with = [&](const std::vector<std::string>& extra) { return trainer(common, extra); };
  const auto out = dir / "elastic";
  const auto elastic = spawn(with({"--nproc", "3", "--max-restarts", "1", "--min-nproc", "2", "--steps", "15",
                                   "--die-rank", "1", "--die-step", "6", "--out", out.string(), "--project",
                                   (out / "project").string()}),
                             {}, dir / "elastic.log");
  ASSERT_EQ(wait_for(elastic, 180s), 0) << read_file(elastic.log);
  const auto log = read_file(elastic.log);
  EXPECT_NE(log.find("rank 1 (pid"), std::string::npos) << log;
  EXPECT_NE(log.find("restart 1 of 1 with 2 process(es)"), std::string::npos) << log;

  // Every sample of every epoch once: the first attempt's steps up to the checkpoint, then the
  // second attempt's (the step the first attempt died in is redone).
  std::map<int64_t, std::multiset<int64_t>> epochs;
  for (const auto& [epoch, step, index] : logged_samples(out, 3, 0))
    if (step <= 6) epochs[epoch].insert(index);
  const auto second = logged_samples(out, 2, 1);
  ASSERT_FALSE(second.empty());
  for (const auto& [epoch, step, index] : second) {
    EXPECT_GT(step, 6);
    epochs[epoch].insert(index);
  }
  ASSERT_EQ(epochs.size(), 3u);
  for (const auto& [epoch, seen] : epochs) {
    EXPECT_EQ(seen.size(), 96u) << "epoch " << epoch;
    for (int64_t i = 0; i < 96; ++i) EXPECT_EQ(seen.count(i), 1u) << "epoch " << epoch << " sample " << i;
  }

  // The model of a run that stops at that checkpoint on 3 ranks and resumes it on 2.
  const auto project = (dir / "reference_project").string();
  const auto first = spawn(with({"--nproc", "3", "--steps", "6", "--out", (dir / "first").string(), "--project", project}),
                           {}, dir / "first.log");
  ASSERT_EQ(wait_for(first, 120s), 0) << read_file(first.log);
  const auto refused = spawn(with({"--nproc", "2", "--steps", "15", "--out", (dir / "refused").string(), "--project",
                                   project}),
                             {}, dir / "refused.log");
  EXPECT_NE(wait_for(refused, 120s), 0) << "a change of world size must be asked for";
  EXPECT_NE(read_file(refused.log).find("allow_world_size_change"), std::string::npos) << read_file(refused.log);
  const auto resumed = spawn(with({"--nproc", "2", "--steps", "15", "--out", (dir / "reference").string(), "--project",
                                   project}),
                             {{"ACCELERATE_ALLOW_WORLD_SIZE_CHANGE", "1"}}, dir / "reference.log");
  ASSERT_EQ(wait_for(resumed, 120s), 0) << read_file(resumed.log);
  const auto expected = read_file(dir / "reference" / "model" / "model.safetensors");
  ASSERT_FALSE(expected.empty());
  EXPECT_TRUE(read_file(out / "model" / "model.safetensors") == expected);
}

// Without --min-nproc a restart runs every rank again, as torchrun's does.
TEST(ElasticRestart, WithoutAMinimumTheJobRestartsWithAllItsRanks) {
  TempDir dir;
  const auto out = dir / "job";
  const auto job = spawn(trainer({"--nproc", "2", "--max-restarts", "3", "--steps", "12", "--checkpoint-every", "4",
                                  "--die-rank", "1", "--die-step", "6", "--out", out.string(), "--project",
                                  (out / "project").string()}),
                         {}, dir / "job.log");
  EXPECT_EQ(wait_for(job, 120s), 0) << read_file(job.log);
  EXPECT_NE(read_file(job.log).find("restart 1 of 3 with 2 process(es)"), std::string::npos) << read_file(job.log);
  EXPECT_EQ(read_file(job.log).find("restart 2 of 3"), std::string::npos) << read_file(job.log);
  EXPECT_TRUE(std::filesystem::exists(out / "model" / "model.safetensors"));
}

// --- preemption ------------------------------------------------------------------------------

void expect_preemption_then_exact_resume(bool signal_the_launcher, int sig) {
  TempDir dir;
  const std::vector<std::string> common = {"--nproc", "2", "--steps", "150", "--step-ms", "20", "--preemptible"};
  auto with = [&](const std::vector<std::string>& extra) { return trainer(common, extra); };
  const auto straight = spawn(with({"--out", (dir / "straight").string()}), {}, dir / "straight.log");
  ASSERT_EQ(wait_for(straight, 120s), 0) << read_file(straight.log);

  const auto out = dir / "preempted";
  const auto project = (dir / "project").string();
  const auto job = spawn(with({"--out", out.string(), "--project", project}), {}, dir / "job.log");
  for (int i = 0; i < 300 && !std::filesystem::exists(out / "rank1.pid"); ++i) std::this_thread::sleep_for(20ms);
  std::this_thread::sleep_for(1000ms);
  if (signal_the_launcher) {
    ::kill(job.pid, sig);
  } else {
    pid_t rank1 = 0;
    std::ifstream(out / "rank1.pid") >> rank1;
    ::kill(rank1, sig);  // SLURM-style: a rank gets the signal; all agree through check_trigger
  }
  EXPECT_EQ(wait_for(job, 60s), 0) << read_file(job.log);
  ASSERT_TRUE(std::filesystem::exists(out / "preempted")) << read_file(job.log);
  EXPECT_FALSE(std::filesystem::exists(out / "model"));
  const auto resumed = spawn(with({"--out", out.string(), "--project", project}), {}, dir / "resumed.log");
  ASSERT_EQ(wait_for(resumed, 120s), 0) << read_file(resumed.log);
  EXPECT_TRUE(read_file(out / "model" / "model.safetensors") ==
              read_file(dir / "straight" / "model" / "model.safetensors"));
}

TEST(Preemption, SigtermToTheLauncherSavesAndExitsZeroThenResumesExactly) {
  expect_preemption_then_exact_resume(true, SIGTERM);
}

TEST(Preemption, SigusrOnOneRankStopsEveryRank) { expect_preemption_then_exact_resume(false, SIGUSR1); }

// Two SIGTERMs 50 ms apart (a scheduler's and an impatient user's): the second is absorbed,
// the state is saved once and every process exits 0 rather than 143.
TEST(Preemption, ASecondSigtermMomentsLaterIsAbsorbed) {
  TempDir dir;
  for (int trial = 0; trial < 3; ++trial) {
    const auto out = dir / ("trial" + std::to_string(trial));
    const auto job = spawn(trainer({"--nproc", "2", "--steps", "100000", "--step-ms", "20", "--preemptible", "--out",
                                    out.string(), "--project", (out / "project").string()}),
                           {}, dir / ("job" + std::to_string(trial) + ".log"));
    for (int i = 0; i < 500 && !std::filesystem::exists(out / "rank1.pid"); ++i) std::this_thread::sleep_for(20ms);
    std::this_thread::sleep_for(1000ms);
    ::kill(job.pid, SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + 20 * trial));
    ::kill(job.pid, SIGTERM);
    EXPECT_EQ(wait_for(job, 60s), 0) << "trial " << trial << ":\n" << read_file(job.log);
    EXPECT_TRUE(std::filesystem::exists(out / "preempted")) << read_file(job.log);
  }
}

// --- misconfiguration ------------------------------------------------------------------------

ACCELERATE_WORKER(accumulation_steps_from_env) {
  const auto steps = static_cast<std::size_t>(std::atoi(std::getenv("TEST_ACCUM")));
  accelerate::Accelerator<accelerate::Gloo, accelerate::Fp32, accelerate::AccumulateDynamic> acc{
      {.accumulation = {.num_steps = steps}, .process_group = {.timeout = 20s}}};
  return 0;
}

TEST(Misconfiguration, DifferentWorldSizesOrOptionsAreNamedOnBothSides) {
  TempDir dir;
  const std::string port = std::to_string(accelerate::detail::free_port());
  auto rank = [&](int r, const std::string& world, const std::string& accum) {
    return spawn({"/proc/self/exe"},
                 {{"ACCELERATE_TEST_WORKER", "accumulation_steps_from_env"}, {"ACCELERATE_TEST_DIR", dir.path().string()},
                  {"TEST_ACCUM", accum}, {"RANK", std::to_string(r)}, {"WORLD_SIZE", world}, {"LOCAL_RANK", "0"},
                  {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}},
                 dir / ("rank" + std::to_string(r) + ".log"));
  };
  {
    auto r0 = rank(0, "2", "4"), r1 = rank(1, "2", "2");
    EXPECT_NE(wait_for(r0, 40s), 0);
    EXPECT_NE(wait_for(r1, 40s), 0);
    const auto log = read_file(r0.log);
    EXPECT_NE(log.find("accumulation.num_steps=4 (rank 1: accumulation.num_steps=2)"), std::string::npos) << log;
  }
  {
    auto r0 = rank(0, "2", "4"), r1 = rank(1, "3", "4");
    EXPECT_NE(wait_for(r0, 60s), 0);
    EXPECT_NE(wait_for(r1, 60s), 0);
    const auto log = read_file(r0.log);
    EXPECT_NE(log.find("world_size=2 (rank 1: world_size=3)"), std::string::npos) << log;
    // The side that expects a third rank names the difference too, not ranks that "never arrived".
    const auto log1 = read_file(r1.log);
    EXPECT_NE(log1.find("world_size=3 (rank 0: world_size=2)"), std::string::npos) << log1;
    EXPECT_EQ(log1.find("never arrived"), std::string::npos) << log1;
  }
}

// Two processes given the same RANK: the second to arrive stops at once naming the rank,
// instead of joining in place of the first (and a third process failing 15 s later).
TEST(Misconfiguration, TheSameRankTwiceIsNamed) {
  TempDir dir;
  const std::string port = std::to_string(accelerate::detail::free_port());
  std::vector<Process> processes;
  for (const int r : {0, 1, 1}) {
    processes.push_back(spawn(
        trainer({"--out", (dir / ("out" + std::to_string(processes.size()))).string(), "--timeout", "10", "--steps",
                 "100", "--step-ms", "10"}),
        {{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", "2"},
         {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}},
        dir / ("process" + std::to_string(processes.size()) + ".log")));
  }
  int named = 0;
  for (auto& p : processes) {
    const int code = wait_for(p, 60s);
    EXPECT_NE(code, -1) << read_file(p.log);
    const auto log = read_file(p.log);
    if (log.find("two processes started as rank 1 of 2") != std::string::npos) {
      ++named;
      EXPECT_NE(code, 0) << log;
    }
    EXPECT_EQ(log.find("never arrived"), std::string::npos) << log;
  }
  EXPECT_GE(named, 1) << read_file(processes[1].log) << read_file(processes[2].log);
}

// --- two hosts -------------------------------------------------------------------------------

// Two network namespaces joined by a veth pair: each is a host with its own address.
class TwoHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0 || std::system("ip netns add acc_host_a 2>/dev/null") != 0)
      GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
    const bool ok = std::system(
                        "ip netns add acc_host_b && "
                        "ip link add acc_veth_a netns acc_host_a type veth peer name acc_veth_b netns acc_host_b && "
                        "ip -n acc_host_a addr add 10.77.0.1/24 dev acc_veth_a && "
                        "ip -n acc_host_b addr add 10.77.0.2/24 dev acc_veth_b && "
                        "ip -n acc_host_a link set acc_veth_a up && ip -n acc_host_b link set acc_veth_b up && "
                        "ip -n acc_host_a link set lo up && ip -n acc_host_b link set lo up") == 0;
    if (!ok) {
      TearDown();
      GTEST_SKIP() << "could not wire the two namespaces (veth unavailable?)";
    }
  }
  void TearDown() override { std::system("ip netns del acc_host_a 2>/dev/null; ip netns del acc_host_b 2>/dev/null"); }

  Process node(int rank, const std::vector<std::string>& args, const std::filesystem::path& log) {
    const std::string ns = rank == 0 ? "acc_host_a" : "acc_host_b";
    std::vector<std::string> command = {"/usr/bin/env", "ip", "netns", "exec", ns, "env",
                                        std::string("GLOO_SOCKET_IFNAME=") + (rank == 0 ? "acc_veth_a" : "acc_veth_b"),
                                        ACCELERATE_TRAINER, "--nproc", "1", "--nnodes", "2", "--node-rank",
                                        std::to_string(rank), "--master-addr", "10.77.0.1", "--master-port", "29811"};
    command.insert(command.end(), args.begin(), args.end());
    return spawn(command, {}, log);
  }
};

TEST_F(TwoHosts, TrainLikeTwoLocalProcessesAndFailClearlyWhenTheLinkDrops) {  // data parallel, ZeRO 2 and 3
  TempDir dir;
  const auto local = spawn(trainer({"--nproc", "2", "--steps", "20", "--out", (dir / "local").string()}), {},
                           dir / "local.log");
  ASSERT_EQ(wait_for(local, 120s), 0) << read_file(local.log);
  auto a = node(0, {"--steps", "20", "--out", (dir / "hosts").string()}, dir / "a.log");
  auto b = node(1, {"--steps", "20", "--out", (dir / "hosts_b").string()}, dir / "b.log");
  ASSERT_EQ(wait_for(a, 120s), 0) << read_file(a.log);
  ASSERT_EQ(wait_for(b, 120s), 0) << read_file(b.log);
  EXPECT_TRUE(read_file(dir / "hosts" / "model" / "model.safetensors") ==
              read_file(dir / "local" / "model" / "model.safetensors"));

  // Sharded (ZeRO stages 2 and 3) across the two hosts ends where it does on one host, byte for
  // byte.
  for (const std::string stage : {"2", "3"}) {
    const auto local_dir = dir / ("zero" + stage + "_local"), hosts_dir = dir / ("zero" + stage + "_hosts");
    const auto zero_local = spawn(trainer({"--nproc", "2", "--steps", "20", "--zero", stage, "--out", local_dir.string()}),
                                  {}, dir / ("zero" + stage + "_local.log"));
    ASSERT_EQ(wait_for(zero_local, 120s), 0) << read_file(zero_local.log);
    auto za = node(0, {"--steps", "20", "--zero", stage, "--out", hosts_dir.string()}, dir / ("za" + stage + ".log"));
    auto zb = node(1, {"--steps", "20", "--zero", stage, "--out", hosts_dir.string() + "_b"}, dir / ("zb" + stage + ".log"));
    ASSERT_EQ(wait_for(za, 120s), 0) << read_file(za.log);
    ASSERT_EQ(wait_for(zb, 120s), 0) << read_file(zb.log);
    EXPECT_TRUE(read_file(hosts_dir / "model" / "model.safetensors") == read_file(local_dir / "model" / "model.safetensors"))
        << "stage " << stage;
  }

  // The link goes down mid-training: both sides stop within the timeout, with a clear error.
  auto a2 = node(0, {"--steps", "100000", "--step-ms", "5", "--timeout", "10", "--out", (dir / "down").string()},
                 dir / "a2.log");
  auto b2 = node(1, {"--steps", "100000", "--step-ms", "5", "--timeout", "10", "--out", (dir / "down_b").string()},
                 dir / "b2.log");
  std::this_thread::sleep_for(4s);
  ASSERT_EQ(std::system("ip -n acc_host_a link set acc_veth_a down"), 0);
  const auto start = Clock::now();
  const int code_a = wait_for(a2, 90s), code_b = wait_for(b2, 90s);
  EXPECT_LT(seconds_since(start), 60.0);
  for (const auto& [code, log] : {std::pair{code_a, read_file(a2.log)}, std::pair{code_b, read_file(b2.log)}}) {
    EXPECT_NE(code, 0) << log;
    EXPECT_NE(code, -1) << "hung:\n" << log;
    EXPECT_NE(log.find("failed on rank"), std::string::npos) << log;
  }
}

}  // namespace
