// Tests that need a CUDA device (label gpu): each skips cleanly without one. Run on a GPU
// machine by scripts/gpu-check.sh.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include "../support/models.hpp"

namespace {

using accelerate::testing::Probe;
using accelerate::testing::TinyNet;
using accelerate::testing::flat_parameters;

#define ACCELERATE_REQUIRE_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"


using Fp16 = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp16>;

TEST(Gpu, SingleProcessPlacesModelAndBatchesOnCuda) {
  ACCELERATE_REQUIRE_CUDA();
  accelerate::Accelerator<> acc;
  ASSERT_EQ(acc.device(), torch::Device(torch::kCUDA, 0));
  TinyNet net;
  auto [model, loader] = acc.prepare(net, accelerate::DataLoader(accelerate::testing::regression_data(16), {.batch_size = 8}));
  for (const auto& p : net->parameters()) EXPECT_TRUE(p.is_cuda());
  for (auto& [x, y] : loader) {
    EXPECT_TRUE(x.is_cuda());
    EXPECT_TRUE(y.is_cuda());
  }
}

TEST(Gpu, Bf16AutocastOnCuda) {
  ACCELERATE_REQUIRE_CUDA();
  accelerate::Accelerator<accelerate::SingleProcess, accelerate::Bf16> acc;
  Probe net;
  auto [model] = acc.prepare(net);
  ASSERT_TRUE(acc.device().is_cuda());
  const auto out = model(torch::randn({4, 8}, acc.device()));
  EXPECT_EQ(net->inner, torch::kBFloat16);
  EXPECT_EQ(out.scalar_type(), torch::kFloat);
}

TEST(Gpu, Fp16ScalerSkipsOnCuda) {
  ACCELERATE_REQUIRE_CUDA();
  Fp16 acc;
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, sgd);
  const auto before = flat_parameters(*net);
  acc.backward(model(torch::randn({4, 8}, acc.device())).sum() * std::numeric_limits<float>::infinity());
  opt.step();
  EXPECT_TRUE(acc.optimizer_step_was_skipped());
  EXPECT_TRUE(torch::equal(before, flat_parameters(*net)));
  EXPECT_DOUBLE_EQ(acc.loss_scale(), 32768.0);
}

}  // namespace
