// Tests of include/accelerate/optim/warmup_cosine.hpp: the schedule's shape, its rates per param
// group, and its resume through save_state/load_state as a prepared scheduler.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <cmath>

#include "../../support/temp_dir.hpp"

namespace {

using accelerate::WarmupCosineLR;

TEST(WarmupCosineLR, RisesLinearlyThenFollowsHalfACosineToItsFloor) {
  torch::nn::Linear net(2, 2);
  torch::optim::SGD sgd(net->parameters(), 1.0);
  const WarmupCosineLR schedule(sgd, {.warmup_steps = 4, .total_steps = 12});
  EXPECT_DOUBLE_EQ(schedule.factor(0), 0.0);
  EXPECT_DOUBLE_EQ(schedule.factor(2), 0.5);
  EXPECT_DOUBLE_EQ(schedule.factor(4), 1.0);
  EXPECT_NEAR(schedule.factor(6), 0.5 * (1 + std::cos(M_PI / 4)), 1e-15);  // a quarter of the decay
  EXPECT_NEAR(schedule.factor(8), 0.5, 1e-15);
  EXPECT_NEAR(schedule.factor(12), 0.0, 1e-15);
  EXPECT_NEAR(schedule.factor(40), 0.0, 1e-15) << "stays at the floor past total_steps";
  const WarmupCosineLR floored(sgd, {.warmup_steps = 0, .total_steps = 10, .min_lr_ratio = 0.1});
  EXPECT_DOUBLE_EQ(floored.factor(0), 1.0);
  EXPECT_NEAR(floored.factor(10), 0.1, 1e-15);
  EXPECT_NEAR(floored.factor(5), 0.1 + 0.9 * 0.5, 1e-15);
}

TEST(WarmupCosineLR, SetsEveryGroupsRateRelativeToItsOwnBase) {
  torch::nn::Linear a(2, 2), b(2, 2);
  torch::optim::SGD sgd(std::vector<torch::optim::OptimizerParamGroup>{
                            torch::optim::OptimizerParamGroup(a->parameters(), std::make_unique<torch::optim::SGDOptions>(1.0)),
                            torch::optim::OptimizerParamGroup(b->parameters(), std::make_unique<torch::optim::SGDOptions>(0.1))},
                        torch::optim::SGDOptions(1.0));
  WarmupCosineLR schedule(sgd, {.warmup_steps = 2, .total_steps = 4});
  const auto lr = [&](std::size_t group) { return sgd.param_groups()[group].options().get_lr(); };
  EXPECT_EQ(lr(0), 0.0) << "building it applies step 0, as LambdaLR";
  schedule.step();
  EXPECT_DOUBLE_EQ(lr(0), 0.5);
  EXPECT_DOUBLE_EQ(lr(1), 0.05);
  schedule.step();
  EXPECT_DOUBLE_EQ(lr(0), 1.0);
  EXPECT_DOUBLE_EQ(lr(1), 0.1);
  EXPECT_EQ(schedule.base_lrs(), (std::vector<double>{1.0, 0.1}));
}

TEST(WarmupCosineLR, RefusesAScheduleThatEndsBeforeItsWarmUp) {
  torch::nn::Linear net(2, 2);
  torch::optim::SGD sgd(net->parameters(), 1.0);
  try {
    WarmupCosineLR(sgd, {.warmup_steps = 10, .total_steps = 5});
    ADD_FAILURE() << "warm-up longer than the schedule";
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("warmup_steps 10 and total_steps 5"), std::string::npos) << e.what();
  }
}

TEST(WarmupCosineLR, IsPreparedAndResumesAtItsStep) {
  accelerate::testing::TempDir dir;
  accelerate::Accelerator<> acc{{.cpu = true}};
  torch::manual_seed(3);
  torch::nn::Linear net(4, 1);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  WarmupCosineLR schedule(sgd, {.warmup_steps = 3, .total_steps = 10});
  auto [model, opt, sched] = acc.prepare(net, sgd, schedule);
  const auto x = torch::randn({8, 4});
  const auto train = [&, &model = model, &opt = opt, &sched = sched](int steps) {
    for (int s = 0; s < steps; ++s) {
      acc.backward(model(x).pow(2).mean());
      opt.step();
      sched.step();
      opt.zero_grad();
    }
    return sgd.param_groups()[0].options().get_lr();
  };
  train(2);
  acc.save_state(dir.path() / "state");
  const double after_four = train(2);
  EXPECT_DOUBLE_EQ(after_four, 0.1 * schedule.factor(4));
  acc.load_state(dir.path() / "state");
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.1 * schedule.factor(2));
  EXPECT_DOUBLE_EQ(train(2), after_four);
}

}  // namespace
