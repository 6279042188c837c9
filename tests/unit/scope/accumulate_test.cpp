// Tests of gradient accumulation and clipping (policy/accumulation.hpp, policy/clip.hpp,
// scope/accumulate.hpp and the prepared optimizer/scheduler) in one process.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include "../../support/models.hpp"

namespace {

using accelerate::testing::TinyNet;
using accelerate::testing::flat_parameters;
using accelerate::testing::regression_data;

// Trains with per-micro-step batch `batch` for `steps` optimizer steps of `N` micro-steps.
template <class Acc>
torch::Tensor train(accelerate::AcceleratorOptions options, int64_t batch, int64_t samples) {
  Acc acc{options};
  torch::manual_seed(3);
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto [model, opt, loader] =
      acc.prepare(net, sgd, accelerate::DataLoader(regression_data(samples), {.batch_size = static_cast<std::size_t>(batch)}));
  for (auto& [x, y] : loader) {
    auto step = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
  }
  return flat_parameters(*net);
}

TEST(Accumulation, FourMicroStepsOfBEqualOneStepOf4B) {
  const auto reference = train<accelerate::Accelerator<>>({.cpu = true}, 32, 8 * 32);
  const auto fixed = train<accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::Accumulate<4>>>(
      {.cpu = true}, 8, 8 * 32);
  const auto dynamic = train<accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::AccumulateDynamic>>(
      {.cpu = true, .accumulation = {.num_steps = 4}}, 8, 8 * 32);
  EXPECT_LE((fixed - reference).abs().max().item<double>(), 1e-6);
  EXPECT_LE((dynamic - reference).abs().max().item<double>(), 1e-6);
  EXPECT_FALSE(torch::equal(reference, train<accelerate::Accelerator<>>({.cpu = true}, 8, 8 * 32)));
}

TEST(Accumulation, TenBatchesInWindowsOfFourMakeThreeOptimizerSteps) {
  using Acc = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::Accumulate<4>>;
  Acc acc{{.cpu = true}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  torch::optim::StepLR lr(sgd, /*step_size=*/1, /*gamma=*/0.5);
  auto [model, opt, sched, loader] = acc.prepare(net, sgd, lr, accelerate::DataLoader(regression_data(40), {.batch_size = 4}));
  std::vector<bool> syncs;
  std::vector<double> divisors;
  int optimizer_steps = 0;
  for (auto& [x, y] : loader) {
    auto step = acc.accumulate(model);
    syncs.push_back(step.sync_gradients());
    EXPECT_EQ(step.sync_gradients(), acc.sync_gradients());
    const auto before = flat_parameters(*net);
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    sched.step();
    opt.zero_grad();
    const bool changed = !torch::equal(before, flat_parameters(*net));
    EXPECT_EQ(changed, step.sync_gradients()) << "optimizer.step() runs on boundaries only";
    if (!step.sync_gradients()) {
      for (const auto& p : net->parameters()) EXPECT_TRUE(p.grad().defined()) << "zero_grad is a no-op off a boundary";
    }
    optimizer_steps += step.sync_gradients();
  }
  EXPECT_EQ(syncs, (std::vector<bool>{false, false, false, true, false, false, false, true, false, true}));
  EXPECT_EQ(optimizer_steps, 3);
  // The scheduler stepped once per optimizer step. LibTorch's StepLR keeps the initial rate
  // on its first step, so 3 steps halve it twice.
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.1 * 0.25);
}

TEST(Accumulation, TheShortLastWindowIsAveragedOverItsOwnLength) {
  // 6 batches in windows of 4: the last window holds 2 micro-steps and must divide by 2, so
  // its gradient equals one step on the concatenated 2 batches.
  using Acc = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::Accumulate<4>>;
  const auto data = regression_data(24);
  auto last_window_gradient = [&](auto& acc, std::size_t batch) {
    torch::manual_seed(1);
    TinyNet net;
    auto [model, loader] = acc.prepare(net, accelerate::DataLoader(data, {.batch_size = batch}));
    std::size_t index = 0;
    for (auto& [x, y] : loader) {
      auto step = acc.accumulate(model);
      if (index++ * batch >= 16) acc.backward(torch::mse_loss(model(x), y));
    }
    return net->fc1->weight.grad().clone();
  };
  Acc windows{{.cpu = true}};
  accelerate::Accelerator<> whole{{.cpu = true}};
  const auto accumulated = last_window_gradient(windows, 4);
  const auto reference = last_window_gradient(whole, 8);  // batches of 8: the last is samples 16..23
  EXPECT_LE((accumulated - reference).abs().max().item<double>(), 1e-6);
}

TEST(Clipping, ClipNormReturnsTheGlobalPreClipNorm) {
  using Acc = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::NoAccumulation,
                                      accelerate::ClipNorm<>>;
  Acc acc{{.cpu = true, .clip = {.max_norm = 0.01}}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.0);  // lr 0: parameters keep, gradients are clipped
  auto [model, opt] = acc.prepare(net, sgd);
  const auto data = regression_data(16);
  acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
  double expected = 0;
  for (const auto& p : net->parameters()) expected += p.grad().pow(2).sum().item<double>();
  expected = std::sqrt(expected);
  opt.step();
  EXPECT_NEAR(acc.last_grad_norm(), expected, 1e-5 * expected);
  double clipped = 0;
  for (const auto& p : net->parameters()) clipped += p.grad().pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(clipped), 0.01, 1e-4);

  // Called directly, with the infinity norm.
  const double inf_norm = acc.clip_grad_norm_(net->parameters(), 1e-3, std::numeric_limits<double>::infinity());
  double largest = 0;
  for (const auto& p : net->parameters()) largest = std::max(largest, p.grad().abs().max().item<double>());
  EXPECT_LE(largest, 1e-3 + 1e-9);
  EXPECT_GT(inf_norm, 1e-3);
}

TEST(Clipping, ClipValueBoundsEveryElement) {
  using Acc = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::NoAccumulation,
                                      accelerate::ClipValue>;
  Acc acc{{.cpu = true, .clip = {.clip_value = 0.001}}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.0);
  auto [model, opt] = acc.prepare(net, sgd);
  const auto data = regression_data(16);
  acc.backward(torch::mse_loss(model(data.inputs()), data.targets()) * 100);
  opt.step();
  for (const auto& p : net->parameters())
    EXPECT_LE(p.grad().abs().max().item<double>(), double(0.001f));  // the float nearest 0.001
}

TEST(Clipping, RunsOnlyOnBoundaries) {
  using Acc = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::Accumulate<2>,
                                      accelerate::ClipValue>;
  Acc acc{{.cpu = true, .clip = {.clip_value = 1e-6}}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.0);
  auto [model, opt] = acc.prepare(net, sgd);
  const auto data = regression_data(16);
  {
    auto step = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
    opt.step();  // not a boundary: nothing is clipped
  }
  EXPECT_GT(net->fc1->weight.grad().abs().max().item<double>(), 1e-6);
}

TEST(Scheduler, StepsOnlyWhenTheOptimizerStepped) {
  using Acc = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::AccumulateDynamic>;
  Acc acc{{.cpu = true, .accumulation = {.num_steps = 3}}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 1.0);
  torch::optim::StepLR lr(sgd, 1, 0.5);
  auto [model, opt, sched] = acc.prepare(net, sgd, lr);
  for (int i = 0; i < 6; ++i) {
    auto step = acc.accumulate(model);
    sched.step();
  }
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.5);  // 2 boundaries: 2 steps
  Acc every{{.cpu = true, .step_scheduler_with_optimizer = false, .accumulation = {.num_steps = 3}}};
  torch::optim::SGD sgd2(net->parameters(), 1.0);
  torch::optim::StepLR lr2(sgd2, 1, 0.5);
  auto [model2, sched2] = every.prepare(TinyNet(), lr2);
  for (int i = 0; i < 3; ++i) sched2.step();
  EXPECT_DOUBLE_EQ(sgd2.param_groups()[0].options().get_lr(), 0.25);  // every call: 3 steps
}

}  // namespace
