// GradientState (gradient_state.hpp): which prepared loaders are being iterated. What a finished
// loop saw must not leak into accumulate() or gather_for_metrics() afterwards.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include "../support/models.hpp"

namespace {

using accelerate::testing::TinyNet;
using accelerate::testing::regression_data;
using Accumulating = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::Accumulate<4>>;

TEST(GradientState, OutsideEveryLoopNothingIsActive) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto [loader] = acc.prepare(accelerate::DataLoader(regression_data(10), {.batch_size = 4}));
  EXPECT_FALSE(acc.end_of_dataloader());
  EXPECT_EQ(acc.remainder(), -1);
  std::vector<bool> ends;
  for (auto& batch : loader) {
    (void)batch;
    ends.push_back(acc.end_of_dataloader());
    EXPECT_EQ(acc.remainder(), 2);  // 10 samples in batches of 4
    EXPECT_TRUE(acc.gradient_state().in_dataloader());
  }
  EXPECT_EQ(ends, (std::vector<bool>{false, false, true}));
  EXPECT_FALSE(acc.end_of_dataloader());
  EXPECT_EQ(acc.remainder(), -1);
  EXPECT_FALSE(acc.gradient_state().in_dataloader());
}

TEST(GradientState, ABreakOutOfTheLoopEndsItsRegistration) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto [loader] = acc.prepare(accelerate::DataLoader(regression_data(8), {.batch_size = 4}));
  for (auto& batch : loader) {
    (void)batch;
    break;
  }
  EXPECT_FALSE(acc.gradient_state().in_dataloader());
  // ...also when the last batch was reached but the loop left before asking for more.
  for (auto& batch : loader) {
    (void)batch;
    if (acc.end_of_dataloader()) break;
  }
  EXPECT_FALSE(acc.end_of_dataloader());
  EXPECT_EQ(acc.gradient_state().depth(), 0u);
}

TEST(GradientState, NestedLoopsReportTheInnermostLoader) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto [outer, inner] = acc.prepare(accelerate::DataLoader(regression_data(8), {.batch_size = 4}),
                                    accelerate::DataLoader(regression_data(9), {.batch_size = 3}));
  std::vector<bool> outer_ends;
  for (auto& a : outer) {
    (void)a;
    std::vector<bool> inner_ends;
    for (auto& b : inner) {
      (void)b;
      inner_ends.push_back(acc.end_of_dataloader());
      EXPECT_EQ(acc.remainder(), 0);  // 9 samples in batches of 3
      EXPECT_EQ(acc.gradient_state().depth(), 2u);
    }
    EXPECT_EQ(inner_ends, (std::vector<bool>{false, false, true}));
    outer_ends.push_back(acc.end_of_dataloader());  // the outer loader is innermost again
    EXPECT_EQ(acc.remainder(), 0);
  }
  EXPECT_EQ(outer_ends, (std::vector<bool>{false, true}));
}

TEST(GradientState, ZippedLoadersFollowTheOneStartedLast) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto [first, second] = acc.prepare(accelerate::DataLoader(regression_data(4), {.batch_size = 2}),
                                     accelerate::DataLoader(regression_data(6), {.batch_size = 2}));
  auto a = first.begin();
  auto b = second.begin();
  std::vector<bool> ends;
  for (; !(a == first.end()) && !(b == second.end()); ++a, ++b) ends.push_back(acc.end_of_dataloader());
  // The first loader ran out after 2 batches; the second, innermost, had 3 and was not at its end.
  EXPECT_EQ(ends, (std::vector<bool>{false, false}));
}

TEST(GradientState, AccumulationInAPlainLoopAfterAPreparedOneStillAccumulates) {
  Accumulating acc{{.cpu = true}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt, loader] = acc.prepare(net, sgd, accelerate::DataLoader(regression_data(16), {.batch_size = 4}));
  for (auto& [x, y] : loader) {
    auto step = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
  }
  // A plain loop (no prepared loader): windows of 4 again, divisor 4.
  auto data = regression_data(32);
  std::vector<bool> syncs;
  for (int i = 0; i < 8; ++i) {
    auto step = acc.accumulate(model);
    syncs.push_back(step.sync_gradients());
  }
  EXPECT_EQ(syncs, (std::vector<bool>{false, false, false, true, false, false, false, true}));
}

TEST(GradientState, GatherForMetricsAfterTheLoopKeepsEverything) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto [loader] = acc.prepare(accelerate::DataLoader(regression_data(10), {.batch_size = 4}));
  std::vector<torch::Tensor> rows;
  for (auto& [x, y] : loader) rows.push_back(x);
  const auto all = acc.gather_for_metrics(torch::cat(rows));
  EXPECT_EQ(all.size(0), 10);
}

}  // namespace
