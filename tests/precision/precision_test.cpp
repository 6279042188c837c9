// Mixed precision: Bf16/Fp16 autocast inside the prepared model, fp32 outputs, the autocast
// scope, and the grad scaler (skip on inf, backoff, growth, accumulation, every rank agrees).
#include <accelerate/accelerate.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "../support/errors.hpp"
#include "../support/models.hpp"
#include "../support/multiprocess.hpp"

namespace {

using namespace std::chrono_literals;
using accelerate::testing::Probe;
using accelerate::testing::TinyNet;
using accelerate::testing::flat_parameters;
using accelerate::testing::regression_data;


template <class Precision>
void expect_autocast_inside_model(torch::ScalarType expected) {
  accelerate::Accelerator<accelerate::SingleProcess, Precision> acc{{.cpu = true}};
  Probe net;
  auto [model] = acc.prepare(net);
  const auto out = model(torch::randn({4, 8}));
  EXPECT_EQ(net->inner, expected) << "the Linear inside the model runs in the policy's dtype";
  EXPECT_EQ(out.scalar_type(), torch::kFloat) << "outputs come back as fp32";
  for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat) << "parameters stay fp32";
  EXPECT_FALSE(accelerate::compat::autocast_enabled(torch::kCPU)) << "autocast is off again after forward";
  const auto direct = net(torch::randn({4, 8}));
  EXPECT_EQ(net->inner, torch::kFloat) << "the unwrapped module runs without autocast";
}

TEST(Precision, Bf16AutocastsTheModelAndKeepsParametersFp32) { expect_autocast_inside_model<accelerate::Bf16>(torch::kBFloat16); }
TEST(Precision, Fp16AutocastsTheModelOnTheCpu) { expect_autocast_inside_model<accelerate::Fp16>(torch::kHalf); }
TEST(Precision, Fp32RunsTheModelInFp32) { expect_autocast_inside_model<accelerate::Fp32>(torch::kFloat); }

// A user-defined policy whose dtype autocast cannot use on this device.
struct Fp64Autocast {
  static constexpr std::string_view name = "fp64";
  static constexpr bool autocast = true;
  static constexpr c10::ScalarType dtype = c10::ScalarType::Double;
  static constexpr bool uses_grad_scaler = false;
};

TEST(Precision, AnUnsupportedAutocastDtypeIsAnErrorNotAFallback) {
  try {
    accelerate::Accelerator<accelerate::SingleProcess, Fp64Autocast> acc{{.cpu = true}};
    FAIL() << "expected an error";
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("mixed precision 'fp64' is not supported by autocast on cpu"),
              std::string::npos) << e.what();
  }
}

TEST(Precision, OutputsCanStayInTheAutocastDtype) {
  accelerate::Accelerator<accelerate::SingleProcess, accelerate::Bf16> acc{{.cpu = true, .precision = {.convert_outputs_to_fp32 = false}}};
  Probe net;
  auto [model] = acc.prepare(net);
  EXPECT_EQ(model(torch::randn({4, 8})).scalar_type(), torch::kBFloat16);
}

TEST(Precision, AutocastScopeCoversWorkOutsideTheModel) {
  accelerate::Accelerator<accelerate::SingleProcess, accelerate::Bf16> acc{{.cpu = true}};
  const auto a = torch::randn({4, 4}), b = torch::randn({4, 4});
  {
    auto scope = acc.autocast();
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    {
      auto nested = acc.autocast();  // scopes nest
      EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    }
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat);
  accelerate::Accelerator<> fp32{{.cpu = true}};
  auto none = fp32.autocast();
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat);
}

template <class Precision>
std::vector<double> losses(int steps) {
  accelerate::Accelerator<accelerate::SingleProcess, Precision> acc{{.cpu = true, .seed = 9}};
  TinyNet net(8, 32, 4);
  torch::optim::Adam adam(net->parameters(), 1e-2);
  auto [model, opt] = acc.prepare(net, adam);
  const auto data = regression_data(64);
  std::vector<double> out;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    auto loss = torch::mse_loss(model(data.inputs()), data.targets());
    acc.backward(loss);
    opt.step();
    out.push_back(loss.template item<double>());
  }
  return out;
}

// bf16 keeps 8 bits of mantissa: over 20 Adam steps the loss stays within 5% (relative) of the
// fp32 run's, and training makes the same progress.
TEST(Precision, Bf16AndFp16TrackTheFp32LossWithinFivePercent) {
  const auto fp32 = losses<accelerate::Fp32>(20);
  for (const auto& other : {losses<accelerate::Bf16>(20), losses<accelerate::Fp16>(20)}) {
    for (std::size_t i = 0; i < fp32.size(); ++i) EXPECT_NEAR(other[i], fp32[i], 0.05 * fp32[i]) << "step " << i;
    EXPECT_LT(other.back(), 0.5 * other.front());
  }
}

using Fp16 = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp16>;

TEST(GradScaler, AnInfGradientSkipsTheStepAndHalvesTheScale) {
  Fp16 acc{{.cpu = true, .seed = 3}};
  EXPECT_DOUBLE_EQ(acc.loss_scale(), 65536.0);
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  torch::optim::StepLR lr(sgd, 1, 0.5);
  auto [model, opt, sched] = acc.prepare(net, sgd, lr);
  const auto data = regression_data(16);
  const auto before = flat_parameters(*net);
  acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
  net->fc1->weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();  // injected overflow
  opt.step();
  sched.step();
  EXPECT_TRUE(acc.optimizer_step_was_skipped());
  EXPECT_TRUE(opt.step_was_skipped());
  EXPECT_TRUE(torch::equal(before, flat_parameters(*net))) << "parameters are bitwise unchanged";
  EXPECT_DOUBLE_EQ(acc.loss_scale(), 32768.0);
  EXPECT_EQ(accelerate::compat::scheduler_step_count(lr), 0u) << "no scheduler step after a skipped step";

  opt.zero_grad();
  acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
  opt.step();
  EXPECT_FALSE(acc.optimizer_step_was_skipped());
  EXPECT_FALSE(torch::equal(before, flat_parameters(*net)));
  EXPECT_DOUBLE_EQ(acc.loss_scale(), 32768.0);
}

// unscale_gradients() hands the true gradients to the loop before opt.step(), which does not
// divide them again; a second unscale in the same step is an error.
TEST(GradScaler, UnscaleGradientsGivesTheTrueGradientsOnce) {
  // Seeded: from an unseeded generator about 1 run in 30 drew weights whose fp16 gradients
  // overflow at the initial scale, so the step was (rightly) skipped and the check below failed.
  Fp16 acc{{.cpu = true, .seed = 3}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, sgd);
  const auto data = regression_data(16);
  for (const bool all : {true, false}) {
    opt.zero_grad();
    acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
    const auto scaled = accelerate::testing::flat_gradients(*net).clone();
    if (all) acc.unscale_gradients();
    else acc.unscale_gradients(opt);
    const auto unscaled = accelerate::testing::flat_gradients(*net).clone();
    EXPECT_TRUE(torch::equal(unscaled, scaled / acc.loss_scale())) << "a power of two: exact";
    try {
      acc.unscale_gradients();
      ADD_FAILURE() << "a second unscale";
    } catch (const accelerate::Error& e) {
      EXPECT_NE(std::string(e.what()).find("unscale_gradients: the gradients of these parameters were already unscaled"),
                std::string::npos) << e.what();
    }
    const auto before = flat_parameters(*net);
    opt.step();
    ASSERT_FALSE(opt.step_was_skipped()) << "the gradients overflowed at scale " << acc.loss_scale();
    // Divided twice, the update would be 65536 times smaller than this.
    EXPECT_TRUE(torch::allclose(flat_parameters(*net), before.add(unscaled, -0.1), 1e-6, 1e-7))
        << "stepped on the true gradients";
  }
}

// Two optimizers, one overflowing: acc.optimizer_step_was_skipped() is true when any skipped
// (Accelerate's rule), and each scheduler follows only the optimizer it sets the rates of —
// also one prepared before its optimizer.
TEST(GradScaler, EachSchedulerFollowsOnlyItsOwnOptimizer) {
  Fp16 acc{{.cpu = true, .seed = 3}};
  TinyNet first, second;
  torch::optim::SGD sgd_first(first->parameters(), 0.1), sgd_second(second->parameters(), 0.1);
  torch::optim::StepLR lr_first(sgd_first, 1, 0.5), lr_second(sgd_second, 1, 0.5);
  auto [model_first, model_second, sched_second, opt_first, opt_second, sched_first] =
      acc.prepare(first, second, lr_second, sgd_first, sgd_second, lr_first);
  const auto data = regression_data(16);
  const auto step = [&](bool overflow_first) {
    opt_first.zero_grad();
    opt_second.zero_grad();
    acc.backward(torch::mse_loss(model_first(data.inputs()), data.targets()) +
                 torch::mse_loss(model_second(data.inputs()), data.targets()));
    if (overflow_first) first->fc1->weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
    opt_first.step();
    opt_second.step();  // the last step taken: it alone decided before
    sched_first.step();
    sched_second.step();
  };
  step(/*overflow_first=*/true);
  EXPECT_TRUE(opt_first.step_was_skipped());
  EXPECT_FALSE(opt_second.step_was_skipped());
  EXPECT_TRUE(acc.optimizer_step_was_skipped()) << "one optimizer skipped";
  EXPECT_EQ(accelerate::compat::scheduler_step_count(lr_first), 0u) << "its optimizer skipped";
  EXPECT_EQ(accelerate::compat::scheduler_step_count(lr_second), 1u) << "its optimizer stepped";
  EXPECT_DOUBLE_EQ(sgd_first.param_groups()[0].options().get_lr(), 0.1) << "unchanged, also by the probe";

  step(/*overflow_first=*/false);
  EXPECT_FALSE(acc.optimizer_step_was_skipped());
  EXPECT_EQ(accelerate::compat::scheduler_step_count(lr_first), 1u);
  EXPECT_EQ(accelerate::compat::scheduler_step_count(lr_second), 2u);
  // LibTorch's StepLR changes the rate from its second step on.
  EXPECT_DOUBLE_EQ(sgd_first.param_groups()[0].options().get_lr(), 0.1);
  EXPECT_DOUBLE_EQ(sgd_second.param_groups()[0].options().get_lr(), 0.05);
}

TEST(GradScaler, UnscalesBeforeTheOptimizerStep) {
  // The gradients the optimizer sees are the true ones: compare with an fp32 step.
  accelerate::Accelerator<> plain{{.cpu = true}};
  Fp16 scaled{{.cpu = true}};
  auto step_once = [](auto& acc) {
    torch::manual_seed(4);
    TinyNet net;
    torch::optim::SGD sgd(net->parameters(), 0.1);
    auto [model, opt] = acc.prepare(net, sgd);
    const auto x = torch::randn({8, 8});
    acc.backward(model(x).pow(2).mean());
    opt.step();
    return net->fc2->weight.grad().clone();
  };
  const auto reference = step_once(plain);
  const auto unscaled = step_once(scaled);
  EXPECT_LE((reference - unscaled).abs().max().item<double>(), 2e-2 * reference.abs().max().item<double>());
}

TEST(GradScaler, AShortGrowthIntervalDoublesTheScale) {
  Fp16 acc{{.cpu = true, .precision = {.grad_scaler = {.init_scale = 1024.0, .growth_interval = 3}}}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.01);
  auto [model, opt] = acc.prepare(net, sgd);
  const auto data = regression_data(16);
  std::vector<double> scales;
  for (int i = 0; i < 7; ++i) {
    opt.zero_grad();
    acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
    opt.step();
    scales.push_back(acc.loss_scale());
  }
  EXPECT_EQ(scales, (std::vector<double>{1024, 1024, 2048, 2048, 2048, 4096, 4096}));
}

TEST(GradScaler, WithAccumulationActsOnSyncStepsOnly) {
  accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp16, accelerate::Accumulate<2>> acc{
      {.cpu = true, .precision = {.grad_scaler = {.init_scale = 256.0, .growth_interval = 2}}}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.01);
  auto [model, opt] = acc.prepare(net, sgd);
  const auto data = regression_data(16);
  std::vector<double> scales;
  for (int i = 0; i < 8; ++i) {
    auto step = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
    opt.step();
    opt.zero_grad();
    scales.push_back(acc.loss_scale());
  }
  // 4 optimizer steps with growth every 2 clean steps: doubles after the 2nd and 4th.
  EXPECT_EQ(scales, (std::vector<double>{256, 256, 256, 512, 512, 512, 512, 1024}));
}

// Manual clipping on every micro-step must equal clipping on boundaries only: off a boundary
// clip_grad_norm_ and clip_grad_value_ do nothing (they must not unscale partial gradients
// to which later micro-steps add scaled ones).
TEST(GradScaler, ManualClippingOffABoundaryDoesNothing) {
  using Acc = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp16, accelerate::Accumulate<2>>;
  auto train = [](bool clip_every_micro_step, bool by_value) {
    Acc acc{{.cpu = true, .precision = {.grad_scaler = {.init_scale = 1024.0}}}};
    torch::manual_seed(5);
    TinyNet net;
    torch::optim::SGD sgd(net->parameters(), 0.01);
    auto [model, opt] = acc.prepare(net, sgd);
    const auto data = regression_data(16);
    for (int i = 0; i < 6; ++i) {
      auto step = acc.accumulate(model);
      acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
      if (clip_every_micro_step || acc.sync_gradients()) {
        if (by_value) {
          acc.clip_grad_value_(net->parameters(), 1e9);
        } else {
          const double norm = acc.clip_grad_norm_(net->parameters(), 1e9);
          if (!acc.sync_gradients()) {
            EXPECT_EQ(norm, 0.0) << "off a boundary the norm is not measured";
          }
        }
      }
      opt.step();
      opt.zero_grad();
    }
    return flat_parameters(*net);
  };
  for (const bool by_value : {false, true}) {
    const auto reference = train(false, by_value);
    const auto every = train(true, by_value);
    EXPECT_LE((reference - every).abs().max().item<double>(), 1e-6) << (by_value ? "clip_grad_value_" : "clip_grad_norm_");
  }
}

TEST(GradScaler, ASecondUnscaleInOneStepIsAnError) {
  Fp16 acc{{.cpu = true, .seed = 3}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, sgd);
  const auto data = regression_data(16);
  acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
  acc.clip_grad_norm_(net->parameters(), 1.0);
  EXPECT_THAT(accelerate::testing::error_of([&] { acc.clip_grad_value_(net->parameters(), 1.0); }),
              ::testing::HasSubstr("already unscaled"));
  opt.step();  // the policy's own unscale is not a second one
  opt.zero_grad();
  acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
  EXPECT_NO_THROW(acc.clip_grad_norm_(net->parameters(), 1.0)) << "a new step may unscale again";
}

TEST(GradScaler, StateRoundTrips) {
  accelerate::GradScaler scaler({.init_scale = 8.0, .growth_interval = 5}, torch::kCPU);
  scaler.update(torch::zeros({1}));
  scaler.update(torch::ones({1}));
  scaler.update(torch::zeros({1}));
  const auto state = scaler.state_dict();
  accelerate::GradScaler restored({}, torch::kCPU);
  restored.load_state_dict(state);
  EXPECT_DOUBLE_EQ(restored.get_scale(), 4.0);
  EXPECT_EQ(restored.growth_tracker(), 1);
  EXPECT_EQ(restored.options().growth_interval, 5);
}

ACCELERATE_WORKER(overflow_on_one_rank) {
  accelerate::Accelerator<accelerate::Gloo, accelerate::Fp16> acc{{.process_group = {.timeout = 60s}}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, sgd);
  const auto before = flat_parameters(*net);
  const auto data = regression_data(16);
  // Rank 1's loss overflows; the gradients all ranks see after averaging carry the inf.
  auto loss = torch::mse_loss(model(data.inputs()), data.targets());
  if (acc.process_index() == 1) loss = loss * std::numeric_limits<float>::infinity();
  acc.backward(loss);
  opt.step();
  const bool skipped = acc.optimizer_step_was_skipped();
  const bool unchanged = torch::equal(before, flat_parameters(*net));
  std::ofstream(accelerate::testing::job_dir() / ("rank" + std::to_string(acc.process_index()) + ".skip"))
      << skipped << unchanged << acc.loss_scale();
  return skipped && unchanged ? 0 : 3;
}

TEST(GradScalerTwoRanks, EveryRankSkipsWhenOneOverflows) {
  auto job = accelerate::testing::run_job("overflow_on_one_rank", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  std::string r0, r1;
  std::ifstream(job.dir / "rank0.skip") >> r0;
  std::ifstream(job.dir / "rank1.skip") >> r1;
  EXPECT_EQ(r0, "1132768");
  EXPECT_EQ(r0, r1);
}

}  // namespace
