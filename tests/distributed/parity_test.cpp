// The rest of Accelerate's training API where it communicates, with real processes: the
// plateau scheduler's averaged metric, LBFGS across ranks, find_executable_batch_size agreeing
// on a size, per-rank profiles, ACCELERATE_DEBUG_MODE, and free_memory() under a sharded
// backend.
#include <accelerate/accelerate.hpp>
#include <accelerate/distributed/sharded.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../support/prelude.hpp"

namespace {

using namespace accelerate::testing::prelude;
using Acc = accelerate::Accelerator<accelerate::Gloo>;
using Plateau = torch::optim::ReduceLROnPlateauScheduler;

// Each rank passes its own metric; the plateau scheduler sees their mean on every rank. Rank 0
// alone would see 1 then 2 (worse: with patience 0 it would halve its rate), rank 1 alone 3 then
// 0; their means, 2 then 1, improve, so no rank reduces.
ACCELERATE_WORKER(plateau_metric_averaged) {
  Acc acc{{.process_group = {.timeout = 30s}}};
  const int rank = acc.process_index();
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  Plateau plateau(sgd, Plateau::min, /*factor=*/0.5, /*patience=*/0);
  auto [model, opt, sched] = acc.prepare(net, sgd, plateau);
  const std::vector<float> mine = rank == 0 ? std::vector<float>{1, 2} : std::vector<float>{3, 0};
  for (const float metric : mine) sched.step(metric);
  const auto state = accelerate::compat::plateau_state(plateau);
  if (state.best != 1.0F || state.num_bad_epochs != 0) return 2;
  if (sgd.param_groups()[0].options().get_lr() != 0.1) return 3;
  return 0;
}

TEST(ReduceLROnPlateau, EveryRankSeesTheMeanMetric) {
  auto job = run_job("plateau_metric_averaged", {.world_size = 2});
  EXPECT_EQ(job.exit_code, 0) << job.logs();
}

constexpr int64_t kRows = 24;

at::Tensor lbfgs_parameters(TinyNet& net, const at::Tensor& x, const at::Tensor& y,
                            const std::function<void(const at::Tensor&)>& backward) {
  torch::optim::LBFGS lbfgs(net->parameters(), torch::optim::LBFGSOptions(0.5).max_iter(5));
  for (int i = 0; i < 3; ++i) {
    lbfgs.step([&] {
      lbfgs.zero_grad();
      auto loss = torch::mse_loss(net(x), y);
      backward(loss);
      return loss;
    });
  }
  return flat_parameters(*net);
}

// Each rank evaluates its equal share of the rows; every closure's backward averages the
// gradients, so LBFGS sees the full batch's gradient and every rank takes the same steps.
ACCELERATE_WORKER(lbfgs_ranks) {
  Acc acc{{.process_group = {.timeout = 30s}}};
  const int64_t share = kRows / acc.num_processes();
  const auto data = regression_data(kRows);
  const auto x = data.inputs().narrow(0, acc.process_index() * share, share);
  const auto y = data.targets().narrow(0, acc.process_index() * share, share);
  torch::manual_seed(1);
  TinyNet net;
  torch::optim::LBFGS lbfgs(net->parameters(), torch::optim::LBFGSOptions(0.5).max_iter(5));
  auto [model, opt] = acc.prepare(net, lbfgs);
  for (int i = 0; i < 3; ++i) {
    opt.step([&] {
      opt.zero_grad();
      auto loss = torch::mse_loss(model(x), y);
      acc.backward(loss);
      return loss;
    });
  }
  save_tensor(job_dir() / ("params_" + std::to_string(acc.process_index()) + ".bin"), flat_parameters(*net));
  return 0;
}

TEST(Lbfgs, RanksTakeTheFullBatchStepsTogether) {
  for (const int world : {2, 3}) {
    auto job = run_job("lbfgs_ranks", {.world_size = world});
    ASSERT_EQ(job.exit_code, 0) << job.logs();
    const auto data = regression_data(kRows);
    torch::manual_seed(1);
    TinyNet reference;
    const auto expected =
        lbfgs_parameters(reference, data.inputs(), data.targets(), [](const at::Tensor& loss) { loss.backward(); });
    const auto rank0 = load_tensor(job.dir / "params_0.bin");
    for (int r = 1; r < world; ++r)
      EXPECT_TRUE(torch::equal(rank0, load_tensor(job.dir / ("params_" + std::to_string(r) + ".bin")))) << "rank " << r;
    EXPECT_TRUE(torch::allclose(rank0, expected.to(torch::kDouble), 1e-4, 1e-5))
        << world << " ranks: max difference " << (rank0 - expected.to(torch::kDouble)).abs().max().item<double>();
  }
}

// Rank r runs out of memory above 64 >> r (a real failed allocation): all ranks retry together
// until the smallest fits everywhere, each attempt also making a collective before it fails.
ACCELERATE_WORKER(batch_size_agreed) {
  Acc acc{{.process_group = {.timeout = 30s}}};
  const int rank = acc.process_index();
  std::vector<std::int64_t> tried;
  const std::int64_t found = acc.find_executable_batch_size(
      [&](std::int64_t batch_size) {
        tried.push_back(batch_size);
        acc.wait_for_everyone();
        const at::Tensor activations = at::empty({batch_size > (64 >> rank) ? std::int64_t{1} << 48 : batch_size});
        return activations.numel();
      },
      128);
  std::ofstream(job_dir() / ("rank_" + std::to_string(rank) + ".json")) << nlohmann::json{{"tried", tried}, {"found", found}};
  return 0;
}

TEST(FindExecutableBatchSize, EveryRankAgreesOnTheSize) {
  for (const int world : {2, 3}) {
    auto job = run_job("batch_size_agreed", {.world_size = world});
    ASSERT_EQ(job.exit_code, 0) << job.logs();
    const std::int64_t smallest_limit = 64 >> (world - 1);
    std::vector<std::int64_t> expected;
    for (std::int64_t size = 128; size >= smallest_limit; size /= 2) expected.push_back(size);
    for (int r = 0; r < world; ++r) {
      const auto result = nlohmann::json::parse(std::ifstream(job.dir / ("rank_" + std::to_string(r) + ".json")));
      EXPECT_EQ(result.at("found").get<std::int64_t>(), smallest_limit) << "rank " << r;
      EXPECT_EQ(result.at("tried").get<std::vector<std::int64_t>>(), expected) << "rank " << r;
    }
  }
}

// Each rank profiles two data-parallel steps into its own trace, collectives included.
ACCELERATE_WORKER(profile_ranks) {
  Acc acc{{.process_group = {.timeout = 30s}}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, sgd);
  const auto data = regression_data(8);
  auto profiling = acc.profile({.output_trace_dir = job_dir() / "traces"});
  for (int i = 0; i < 2; ++i) {
    acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
    opt.step();
    opt.zero_grad();
  }
  const auto path = profiling.finish();
  return path == job_dir() / "traces" / ("profile_" + std::to_string(acc.process_index()) + ".json") ? 0 : 2;
}

TEST(Profile, EveryRankWritesItsTraceWithTheCollectives) {
  auto job = run_job("profile_ranks", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  for (const int rank : {0, 1}) {
    const auto trace = nlohmann::json::parse(std::ifstream(job.dir / "traces" / ("profile_" + std::to_string(rank) + ".json")));
    bool collective = false, matmul = false;
    for (const auto& event : trace.at("traceEvents")) {
      const std::string name = event.value("name", "");
      collective = collective || name.find("gloo:") == 0;
      matmul = matmul || name == "aten::addmm";
    }
    EXPECT_TRUE(collective) << "rank " << rank << ": a gloo: collective";
    EXPECT_TRUE(matmul) << "rank " << rank;
    EXPECT_NE(job.log(rank).find("wrote its profile trace to"), std::string::npos) << job.log(rank);
  }
}

// ACCELERATE_DEBUG_MODE=1 turns on the cross-rank check of every collective, as the option
// does: rank 0 in a backward while rank 1 reduces a metric fails on both, naming both.
ACCELERATE_WORKER(unmatched_collectives_debug_mode) {
  Acc acc{{.process_group = {.timeout = 30s}}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, sgd);
  const auto data = regression_data(8);
  try {
    if (acc.process_index() == 0) acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
    else acc.reduce(torch::tensor({1.0}));
  } catch (const accelerate::Error& e) {
    std::cerr << e.what() << std::endl;
    return 7;
  }
  return 0;
}

ACCELERATE_WORKER(join_only_debug_mode) {
  Acc acc{{.process_group = {.timeout = 30s}}};
  return 0;
}

TEST(DebugMode, TheEnvironmentVariableChecksEveryCollective) {
  auto job = run_job("unmatched_collectives_debug_mode", {.world_size = 2, .env = {{"ACCELERATE_DEBUG_MODE", "1"}}});
  EXPECT_EQ(job.exit_code, 7) << job.logs();
  for (const int rank : {0, 1}) {
    EXPECT_NE(job.log(rank).find("collective mismatch"), std::string::npos) << job.log(rank);
    EXPECT_NE(job.log(rank).find("rank 0 calls all_reduce of "), std::string::npos) << job.log(rank);
    EXPECT_NE(job.log(rank).find("rank 1 calls all_gather of "), std::string::npos) << job.log(rank);
  }
  auto wrong = run_job("join_only_debug_mode", {.world_size = 2, .env = {{"ACCELERATE_DEBUG_MODE", "maybe"}}});
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.logs().find("ACCELERATE_DEBUG_MODE='maybe'"), std::string::npos) << wrong.logs();
}

// free_memory() under a sharded backend: a second model, of another shape, trains and
// checkpoints as if it were the first (the engine forgot the first's shards).
ACCELERATE_WORKER(free_memory_sharded) {
  accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 2>> acc{{.process_group = {.timeout = 30s}}};
  const auto data = regression_data(8);
  const auto train = [&](auto& model, auto& opt) {
    for (int i = 0; i < 2; ++i) {
      acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
      opt.step();
      opt.zero_grad();
    }
  };
  {
    TinyNet first(8, 16, 4);
    torch::optim::AdamW adamw(first->parameters(), 0.01);
    auto [model, opt] = acc.prepare(first, adamw);
    train(model, opt);
    acc.free_memory();
  }
  TinyNet second(8, 7, 4);
  torch::optim::AdamW adamw(second->parameters(), 0.01);
  auto [model, opt] = acc.prepare(second, adamw);
  train(model, opt);
  const auto checkpoint = job_dir() / "checkpoint";
  acc.save_state(checkpoint);
  const auto trained = flat_parameters(*second);
  train(model, opt);
  acc.load_state(checkpoint);
  if (!torch::equal(trained, flat_parameters(*second))) return 2;
  if (acc.checkpoint_entries().size() != 2) return 3;
  save_tensor(job_dir() / ("params_" + std::to_string(acc.process_index()) + ".bin"), trained);
  return 0;
}

TEST(FreeMemory, ASecondModelTrainsAndCheckpointsUnderShardedBackend) {
  auto job = run_job("free_memory_sharded", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  EXPECT_TRUE(torch::equal(load_tensor(job.dir / "params_0.bin"), load_tensor(job.dir / "params_1.bin")));
  EXPECT_FALSE(std::filesystem::exists(job.dir / "checkpoint" / "model_1.safetensors"));
}

// estimate_memory under each Backend against what the tensors hold after a synchronised
// backward and step: data parallel with bucket views and with copies, Zero stages 1 and 2 on
// a parameter count no world size divides, in small buckets (each padded separately).
template <class Accelerator>
int check_estimate(bool views) {
  Accelerator acc{{.process_group = {.timeout = 30s},
                   .ddp = {.bucket_cap_bytes = 256, .first_bucket_cap_bytes = 256, .gradient_as_bucket_view = views}}};
  TinyNet net(6, 5, 3);
  torch::optim::AdamW adamw(net->parameters(), 0.01);
  auto [model, opt] = acc.prepare(net, adamw);
  const auto data = regression_data(8, 6, 3);
  acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
  opt.step();
  const auto estimate = accelerate::estimate_memory(acc, model, opt);
  const auto* reducer = model.model_sync().reducer();
  const auto gradients = static_cast<std::int64_t>(reducer->gradient_memory_bytes());
  std::int64_t state = 0;
  for (const auto& [key, t] : accelerate::checkpoint::optimizer_state_dict(adamw).tensors) state += t.nbytes();
  std::cerr << "estimate: " << estimate << "; held: gradients " << gradients << " B, optimizer state " << state
            << " B, parameters " << accelerate::testing::parameter_bytes(*net) << " B; estimate in bytes: "
            << estimate.parameters << " " << estimate.gradients << " " << estimate.optimizer_state << std::endl;
  if (estimate.parameters != accelerate::testing::parameter_bytes(*net)) return 2;
  if (estimate.gradients != gradients) return 3;
  if (estimate.optimizer_state != state) return 4;
  return 0;
}

ACCELERATE_WORKER(estimate_memory_backends) {
  std::string backend = std::getenv("ACCELERATE_TEST_ARGS");  // one argument per line
  backend = backend.substr(0, backend.find('\n'));
  if (backend == "views") return check_estimate<Acc>(true);
  if (backend == "copies") return check_estimate<Acc>(false);
  if (backend == "zero1") return check_estimate<accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 1>>>(true);
  if (backend == "zero2") return check_estimate<accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 2>>>(true);
  return 9;
}

TEST(EstimateMemory, EqualsTheBytesHeldUnderEachBackend) {
  for (const int world : {2, 3}) {
    for (const std::string backend : {"views", "copies", "zero1", "zero2"}) {
      auto job = run_job("estimate_memory_backends", {.world_size = world, .args = {backend}});
      EXPECT_EQ(job.exit_code, 0) << backend << " on " << world << " ranks\n" << job.logs();
    }
  }
}

}  // namespace
