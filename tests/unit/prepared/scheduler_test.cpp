// Tests of include/accelerate/prepared/scheduler.hpp and of the closure step of
// prepared/optimizer.hpp: ReduceLROnPlateau, user-written schedulers, and LBFGS.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../support/models.hpp"
#include "../../support/temp_dir.hpp"

namespace {

using accelerate::testing::TempDir;
using accelerate::testing::TinyNet;
using accelerate::testing::flat_parameters;
using accelerate::testing::regression_data;
using Plateau = torch::optim::ReduceLROnPlateauScheduler;

double learning_rate(const torch::optim::Optimizer& optimizer) {
  return optimizer.param_groups()[0].options().get_lr();
}

// Off the accumulation boundaries step(metric) does nothing; on them it evaluates once (not
// num_processes times) and reduces after `patience` evaluations without improvement.
TEST(PreparedScheduler, ReduceLROnPlateauEvaluatesOnlyWhenTheOptimizerStepped) {
  accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::Accumulate<2>> acc{{.cpu = true}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  Plateau plateau(sgd, Plateau::min, /*factor=*/0.5, /*patience=*/1);
  auto [model, opt, sched] = acc.prepare(net, sgd, plateau);
  const auto data = regression_data(8);
  for (int micro = 0; micro < 8; ++micro) {
    auto step = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
    opt.step();
    sched.step(1.0F);  // never improves after the first evaluation
    opt.zero_grad();
  }
  // 4 evaluations: the best, then 2 bad ones (> patience 1) reduce the rate, then 1 bad one.
  const auto state = accelerate::compat::plateau_state(plateau);
  EXPECT_EQ(state.last_epoch, 4);
  EXPECT_EQ(state.num_bad_epochs, 1);
  EXPECT_FLOAT_EQ(state.best, 1.0F);
  EXPECT_DOUBLE_EQ(learning_rate(sgd), 0.05);
}

// save_state after some evaluations, load_state into fresh objects: the same evaluations then
// reduce the rates at the same points as the uninterrupted run (best, bad evaluations and
// cooldown restored, in scheduler.json).
TEST(PreparedScheduler, ReduceLROnPlateauResumesExactly) {
  const std::vector<float> metrics{1.0F, 0.9F, 0.95F, 0.96F, 0.97F, 0.5F, 0.6F, 0.7F, 0.8F, 0.9F};
  constexpr std::size_t kBefore = 4;
  TempDir dir;
  const auto run = [&](bool resume) {
    accelerate::Accelerator<> acc{{.cpu = true}};
    TinyNet net;
    torch::optim::SGD sgd(net->parameters(), 0.1);
    Plateau plateau(sgd, Plateau::min, /*factor=*/0.5, /*patience=*/1, 1e-4, Plateau::rel, /*cooldown=*/1);
    auto [opt, sched] = acc.prepare(sgd, plateau);
    std::vector<double> rates;
    std::size_t first = 0;
    if (resume) {
      acc.load_state(dir.path() / "checkpoint");
      first = kBefore;
    }
    for (std::size_t i = first; i < metrics.size(); ++i) {
      sched.step(metrics[i]);
      if (i + 1 == kBefore && !resume) acc.save_state(dir.path() / "checkpoint");
      if (i + 1 > kBefore) rates.push_back(learning_rate(sgd));
    }
    const auto state = accelerate::compat::plateau_state(plateau);
    return std::tuple(rates, state.last_epoch, state.best, state.num_bad_epochs, state.cooldown_counter);
  };
  const auto whole = run(false);
  const auto resumed = run(true);
  EXPECT_EQ(std::get<0>(whole), std::get<0>(resumed));
  EXPECT_LT(std::get<0>(whole).back(), 0.1) << "the run must reduce the rate to test anything";
  EXPECT_EQ(std::get<1>(whole), std::get<1>(resumed));
  EXPECT_EQ(std::get<2>(whole), std::get<2>(resumed));
  EXPECT_EQ(std::get<3>(whole), std::get<3>(resumed));
  EXPECT_EQ(std::get<4>(whole), std::get<4>(resumed));
  const auto saved = nlohmann::json::parse(std::ifstream(dir.path() / "checkpoint" / "scheduler.json"));
  EXPECT_EQ(saved.at("last_epoch"), 4);
  EXPECT_FLOAT_EQ(saved.at("best").get<float>(), 0.9F);
}

// JSON has no infinity: a best metric of -inf is written as text and read back exactly.
TEST(PreparedScheduler, ReduceLROnPlateauKeepsAnInfiniteBest) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  torch::optim::SGD sgd1(TinyNet()->parameters(), 0.1), sgd2(TinyNet()->parameters(), 0.1);
  Plateau saved_plateau(sgd1), loaded_plateau(sgd2);
  auto [saved, loaded] = acc.prepare(saved_plateau, loaded_plateau);
  saved.step(-std::numeric_limits<float>::infinity());
  const auto state = saved.state_dict();
  EXPECT_EQ(state.values.at("best"), "-inf");
  loaded.load_state_dict(state);
  EXPECT_EQ(accelerate::compat::plateau_state(loaded_plateau).best, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(accelerate::compat::plateau_state(loaded_plateau).last_epoch, 1);
}

// A user's schedule: linear warm-up over `warmup` steps, then constant.
struct WarmupScheduler : torch::optim::LRScheduler {
  WarmupScheduler(torch::optim::Optimizer& optimizer, double base, unsigned warmup)
      : torch::optim::LRScheduler(optimizer), base_(base), warmup_(warmup) {}
  std::vector<double> get_lrs() override {
    const double factor = std::min(1.0, static_cast<double>(step_count_ + 1) / warmup_);
    return std::vector<double>(get_current_lrs().size(), base_ * factor);
  }
  double base_;
  unsigned warmup_;
};

// A user-written LRScheduler is stepped on optimizer steps only and saved by its step count.
TEST(PreparedScheduler, AUserWrittenSchedulerFollowsTheOptimizerAndResumes) {
  using Acc = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::Accumulate<2>>;
  TempDir dir;
  Acc acc{{.cpu = true}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.0);
  WarmupScheduler warmup(sgd, 0.1, 4);
  auto [model, opt, sched] = acc.prepare(net, sgd, warmup);
  const auto data = regression_data(8);
  for (int micro = 0; micro < 6; ++micro) {
    auto step = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
    opt.step();
    sched.step();
    opt.zero_grad();
  }
  EXPECT_EQ(accelerate::compat::scheduler_step_count(warmup), 3u) << "3 optimizer steps in 6 micro-steps";
  EXPECT_DOUBLE_EQ(learning_rate(sgd), 0.1 * 3 / 4);
  acc.save_state(dir.path() / "checkpoint");

  Acc other{{.cpu = true}};
  TinyNet net2;
  torch::optim::SGD sgd2(net2->parameters(), 0.0);
  WarmupScheduler warmup2(sgd2, 0.1, 4);
  auto [model2, opt2, sched2] = other.prepare(net2, sgd2, warmup2);
  other.load_state(dir.path() / "checkpoint");
  EXPECT_EQ(accelerate::compat::scheduler_step_count(warmup2), 3u);
  EXPECT_DOUBLE_EQ(learning_rate(sgd2), 0.1 * 3 / 4) << "the rate comes back with the optimizer";
}

// A scheduler with state of its own saves it through state_dict()/load_state_dict().
struct CountingScheduler : WarmupScheduler {
  using WarmupScheduler::WarmupScheduler;
  accelerate::StateDict state_dict() const {
    accelerate::StateDict s;
    s.values["calls"] = calls;
    return s;
  }
  void load_state_dict(const accelerate::StateDict& s) { calls = s.value<int>("calls"); }
  std::vector<double> get_lrs() override {
    ++calls;
    return WarmupScheduler::get_lrs();
  }
  int calls = 0;
};

TEST(PreparedScheduler, AStatefulUserSchedulerSavesItsOwnState) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  torch::optim::SGD sgd(TinyNet()->parameters(), 0.0);
  CountingScheduler counting(sgd, 0.1, 4);
  auto [sched] = acc.prepare(counting);
  sched.step();
  sched.step();
  EXPECT_EQ(sched.state_dict().values.at("calls"), 2);
  sched.load_state_dict(sched.state_dict());
  EXPECT_EQ(counting.calls, 2);
}

// LibTorch's schedulers do not say which optimizer they set: compat asks by probing the rates,
// and leaves them as they were.
TEST(PreparedScheduler, TheProbeFindsTheSchedulersOptimizer) {
  torch::optim::SGD first(TinyNet()->parameters(), 0.1), second(TinyNet()->parameters(), 0.2);
  torch::optim::StepLR lr(second, 1, 0.5);
  EXPECT_FALSE(accelerate::compat::scheduler_follows(lr, first));
  EXPECT_TRUE(accelerate::compat::scheduler_follows(lr, second));
  EXPECT_DOUBLE_EQ(learning_rate(first), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(second), 0.2);
}

// LBFGS re-evaluates the loss through a closure. Prepared by Accelerator<> it is the
// optimizer's own step, bit for bit.
TEST(PreparedOptimizer, LbfgsWithAClosureStepsAsLibTorchDoes) {
  const auto data = regression_data(16);
  const auto train = [&](auto&& step_with, auto& forward) {
    for (int i = 0; i < 3; ++i) step_with(forward);
  };
  torch::manual_seed(1);
  TinyNet plain_net;
  torch::optim::LBFGS plain(plain_net->parameters(), torch::optim::LBFGSOptions(0.5).max_iter(5));
  train([&](auto& net) {
    plain.step([&] {
      plain.zero_grad();
      auto loss = torch::mse_loss(net(data.inputs()), data.targets());
      loss.backward();
      return loss;
    });
  }, plain_net);

  torch::manual_seed(1);
  accelerate::Accelerator<> acc{{.cpu = true}};
  TinyNet net;
  torch::optim::LBFGS lbfgs(net->parameters(), torch::optim::LBFGSOptions(0.5).max_iter(5));
  auto [model, opt] = acc.prepare(net, lbfgs);
  train([&](auto& m) {
    const at::Tensor first = opt.step([&] {
      opt.zero_grad();
      auto loss = torch::mse_loss(m(data.inputs()), data.targets());
      acc.backward(loss);
      return loss;
    });
    EXPECT_TRUE(first.defined());
  }, model);
  EXPECT_TRUE(torch::equal(flat_parameters(*plain_net), flat_parameters(*net)));
}

// Under ClipNorm every evaluation's gradients are clipped before LBFGS reads them.
TEST(PreparedOptimizer, LbfgsEvaluationsAreClipped) {
  using Acc = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::NoAccumulation,
                                      accelerate::ClipNorm<>>;
  const auto data = regression_data(16);
  constexpr double kMaxNorm = 0.01;
  torch::manual_seed(1);
  Acc acc{{.cpu = true, .clip = {.max_norm = kMaxNorm}}};
  TinyNet net;
  torch::optim::LBFGS lbfgs(net->parameters(), torch::optim::LBFGSOptions(0.5).max_iter(4));
  auto [model, opt] = acc.prepare(net, lbfgs);
  int evaluations = 0;
  opt.step([&] {
    opt.zero_grad();
    auto loss = torch::mse_loss(model(data.inputs()), data.targets());
    acc.backward(loss);
    ++evaluations;
    return loss;
  });
  EXPECT_GT(evaluations, 1);
  EXPECT_GT(acc.last_grad_norm(), kMaxNorm) << "the unclipped norm is larger: clipping acted";
  double squares = 0;
  for (const auto& p : net->parameters()) squares += p.grad().pow(2).sum().item<double>();
  EXPECT_LE(std::sqrt(squares), kMaxNorm * (1 + 1e-5)) << "the last evaluation's gradients, as LBFGS read them";
}

}  // namespace
