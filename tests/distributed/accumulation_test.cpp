// Gradient accumulation and clipping on 2 ranks: no communication off the boundaries, exactly
// one all-reduce round per optimizer step, the same clipped norm on every rank.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <fstream>

#include "../support/prelude.hpp"

namespace {

using namespace accelerate::testing::prelude;

constexpr int kMicro = 4, kSteps = 8;
constexpr int64_t kBatch = 8;

ACCELERATE_WORKER(accumulate_two_ranks) {
  using Acc = accelerate::Accelerator<accelerate::Gloo, accelerate::Fp32, accelerate::Accumulate<kMicro>,
                                      accelerate::ClipNorm<>>;
  Acc acc{{.clip = {.max_norm = 0.5}, .process_group = {.timeout = 60s}}};
  const int world = acc.num_processes();
  torch::manual_seed(3);
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::StepLR lr(sgd, /*step_size=*/1000, /*gamma=*/0.5);
  auto [model, opt, sched, loader] = acc.prepare(
      net, sgd, lr,
      accelerate::DataLoader(accelerate::testing::regression_data(kSteps * kMicro * kBatch * world),
                             {.batch_size = static_cast<std::size_t>(kBatch)}));
  std::vector<double> norms;
  int boundaries = 0;
  for (auto& [x, y] : loader) {
    auto step = acc.accumulate(model);
    const auto before = acc.stats().gradient_allreduce.calls;
    acc.backward(torch::mse_loss(model(x), y));
    if (!step.sync_gradients() && acc.stats().gradient_allreduce.calls != before) return 2;  // no_sync leaked
    opt.step();
    sched.step();
    opt.zero_grad();
    if (step.sync_gradients()) {
      ++boundaries;
      norms.push_back(acc.last_grad_norm());
    }
  }
  const auto stats = acc.stats();
  if (boundaries != kSteps || stats.grad_sync_rounds != kSteps) return 3;
  const int64_t param_bytes = accelerate::testing::parameter_bytes(*net);
  if (stats.gradient_allreduce.bytes != static_cast<uint64_t>(kSteps * param_bytes)) return 4;
  // The scheduler steps num_processes times per optimizer step (Accelerate's rule).
  if (acc.is_main_process()) {
    save_tensor(job_dir() / "params.bin", flat_parameters(*net));
    std::ofstream(job_dir() / "scheduler_steps") << accelerate::compat::scheduler_step_count(lr);
  }
  save_tensor(job_dir() / ("norms_rank" + std::to_string(acc.process_index()) + ".bin"),
              torch::tensor(norms, torch::kDouble));
  return 0;
}

TEST(AccumulationTwoRanks, EqualsOneProcessAndSyncsOncePerOptimizerStep) {
  auto job = run_job("accumulate_two_ranks", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();

  // One process, no accumulation, batch world * N * b: the same samples per optimizer step.
  using Single = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::NoAccumulation,
                                         accelerate::ClipNorm<>>;
  Single acc{{.cpu = true, .clip = {.max_norm = 0.5}}};
  torch::manual_seed(3);
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto [model, opt, loader] = acc.prepare(
      net, sgd,
      accelerate::DataLoader(accelerate::testing::regression_data(kSteps * kMicro * kBatch * 2),
                             {.batch_size = static_cast<std::size_t>(2 * kMicro * kBatch)}));
  std::vector<double> norms;
  for (auto& [x, y] : loader) {
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
    norms.push_back(acc.last_grad_norm());
  }
  const auto params = load_tensor(job.dir / "params.bin");
  EXPECT_LE((params - flat_parameters(*net).to(torch::kDouble)).abs().max().item<double>(), 1e-6);
  const auto norms0 = load_tensor(job.dir / "norms_rank0.bin");
  const auto norms1 = load_tensor(job.dir / "norms_rank1.bin");
  EXPECT_TRUE(torch::equal(norms0, norms1)) << "the clipped norm is identical on every rank";
  EXPECT_LE((norms0 - torch::tensor(norms, torch::kDouble)).abs().max().item<double>(), 1e-5);
  std::ifstream steps(job.dir / "scheduler_steps");
  unsigned count = 0;
  steps >> count;
  EXPECT_EQ(count, 2u * kSteps);
}

ACCELERATE_WORKER(no_sync_bytes) {
  // The same 16 micro-steps with accumulation (no_sync) and with a sync every micro-step.
  const char* every = std::getenv("ACCELERATE_TEST_ARGS");
  const bool sync_every = every && std::string(every).find("every") != std::string::npos;
  accelerate::Accelerator<accelerate::Gloo, accelerate::Fp32, accelerate::AccumulateDynamic> acc{
      {.accumulation = {.num_steps = sync_every ? 1u : 8u}, .process_group = {.timeout = 60s}}};
  TinyNet net;
  auto [model] = acc.prepare(net);
  const auto x = torch::randn({4, 8});
  for (int i = 0; i < 16; ++i) {
    auto step = acc.accumulate(model);
    acc.backward(model(x).sum());
  }
  std::ofstream(job_dir() / ("bytes_rank" + std::to_string(acc.process_index())))
      << acc.stats().gradient_allreduce.bytes;
  return 0;
}

TEST(AccumulationTwoRanks, NoSyncCommunicatesOneNthOfTheBytes) {
  auto read = [](const accelerate::testing::JobResult& job) {
    uint64_t bytes = 0;
    std::ifstream(job.dir / "bytes_rank0") >> bytes;
    return bytes;
  };
  auto accumulated = run_job("no_sync_bytes", {.world_size = 2});
  auto every = run_job("no_sync_bytes", {.world_size = 2, .args = {"every"}});
  ASSERT_EQ(accumulated.exit_code, 0) << accumulated.logs();
  ASSERT_EQ(every.exit_code, 0) << every.logs();
  EXPECT_GT(read(accumulated), 0u);
  EXPECT_EQ(read(accumulated) * 8, read(every));
}

// 16 micro-steps in windows of 4, each rank its own data; with sync_each_batch every micro-step
// all-reduces (and the gradients are the same on every rank inside the window), without it only
// the boundaries do. The optimizer steps on the boundaries either way.
ACCELERATE_WORKER(sync_each_batch) {
  const char* args = std::getenv("ACCELERATE_TEST_ARGS");
  const bool each = args && std::string(args).find("each") != std::string::npos;
  accelerate::Accelerator<accelerate::Gloo, accelerate::Fp32, accelerate::AccumulateDynamic> acc{
      {.accumulation = {.num_steps = 4, .sync_each_batch = each}, .process_group = {.timeout = 60s}}};
  torch::manual_seed(3);
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto [model, opt] = acc.prepare(net, sgd);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(40 + acc.process_index());
  int optimizer_steps = 0;
  for (int micro = 0; micro < 16; ++micro) {
    auto step = acc.accumulate(model);
    const auto x = torch::randn({8, 8}, gen);
    const auto y = torch::randn({8, 4}, gen);
    acc.backward(torch::mse_loss(model(x), y));
    if (!step.sync_gradients()) {
      const auto all = acc.gather(accelerate::testing::flat_gradients(*net).unsqueeze(0));
      if (torch::equal(all[0], all[1]) != each) return 3;  // averaged already, or still local
    }
    const auto before = flat_parameters(*net);
    opt.step();
    opt.zero_grad();
    const bool moved = !torch::equal(before, flat_parameters(*net));
    if (moved != step.sync_gradients()) return 4;  // the optimizer steps on boundaries only
    optimizer_steps += moved ? 1 : 0;
  }
  if (optimizer_steps != 4 || acc.stats().grad_sync_rounds != (each ? 16u : 4u)) return 5;
  if (acc.is_main_process()) save_tensor(job_dir() / "params.bin", flat_parameters(*net));
  return 0;
}

TEST(AccumulationTwoRanks, SyncEachBatchCommunicatesEveryMicroStepWithTheSameResult) {
  auto boundaries = run_job("sync_each_batch", {.world_size = 2});
  auto each = run_job("sync_each_batch", {.world_size = 2, .args = {"each"}});
  ASSERT_EQ(boundaries.exit_code, 0) << boundaries.logs();
  ASSERT_EQ(each.exit_code, 0) << each.logs();
  // The mean of running means is the mean, to rounding.
  EXPECT_LE((load_tensor(each.dir / "params.bin") - load_tensor(boundaries.dir / "params.bin")).abs().max().item<double>(),
            1e-6);
}

// accumulate() inside no_sync(): the inner scope restores what it found, so the whole
// no_sync block communicates nothing, the boundary micro-step included.
ACCELERATE_WORKER(accumulate_inside_no_sync) {
  accelerate::Accelerator<accelerate::Gloo, accelerate::Fp32, accelerate::Accumulate<2>> acc{{.process_group = {.timeout = 60s}}};
  TinyNet net;
  auto [model] = acc.prepare(net);
  const auto x = torch::randn({4, 8});
  {
    auto silent = acc.no_sync(model);
    for (int i = 0; i < 4; ++i) {
      auto step = acc.accumulate(model);
      acc.backward(model(x).sum());
    }
  }
  std::ofstream(job_dir() / ("bytes_rank" + std::to_string(acc.process_index())))
      << acc.stats().gradient_allreduce.bytes << " " << model.model_sync().sync_enabled();
  return 0;
}

TEST(AccumulationTwoRanks, AccumulateInsideNoSyncStaysSilent) {
  auto job = run_job("accumulate_inside_no_sync", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  uint64_t bytes = 1;
  bool enabled_after = false;
  std::ifstream(job.dir / "bytes_rank0") >> bytes >> enabled_after;
  EXPECT_EQ(bytes, 0u) << "no gradient was all-reduced inside no_sync";
  EXPECT_TRUE(enabled_after) << "sync is on again once no_sync ends";
}

// print() prints once per node: here two "nodes" of one rank each.
ACCELERATE_WORKER(print_per_node) {
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 60s}}};
  acc.print("printed by rank", acc.process_index());
  return 0;
}

TEST(PrintTwoRanks, PrintsOncePerNode) {
  auto one_node = run_job("print_per_node", {.world_size = 2});
  auto two_nodes = run_job("print_per_node", {.world_size = 2, .nodes = 2});
  ASSERT_EQ(one_node.exit_code, 0) << one_node.logs();
  ASSERT_EQ(two_nodes.exit_code, 0) << two_nodes.logs();
  EXPECT_NE(one_node.log(0).find("printed by rank 0"), std::string::npos) << one_node.logs();
  EXPECT_EQ(one_node.log(1).find("printed by rank"), std::string::npos) << one_node.logs();
  EXPECT_NE(two_nodes.log(1).find("printed by rank 1"), std::string::npos) << two_nodes.logs();
}

}  // namespace
