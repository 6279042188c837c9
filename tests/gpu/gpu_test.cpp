// Tests that need a CUDA device (label gpu): each skips cleanly without one. Run on a GPU
// machine by scripts/gpu-check.sh.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <ATen/core/CachingHostAllocator.h>

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

TEST(Gpu, StagerCopiesOnASideStreamThroughReusedPinnedBuffers) {
  ACCELERATE_REQUIRE_CUDA();
  const c10::Device cuda(c10::kCUDA, 0);
  accelerate::data::DeviceStager<> stager(accelerate::data::StreamTransfer{cuda});
  const auto compute = c10::impl::VirtualGuardImpl(c10::kCUDA).getStream(cuda);
  EXPECT_NE(stager.transfer().side_stream(), compute);
  std::vector<std::pair<at::Tensor, at::Tensor>> sources;
  std::vector<at::Tensor> sums;  // queued on the compute stream right after each batch is staged
  std::vector<std::pair<at::Tensor, at::Tensor>> staged;
  for (int k = 0; k < 20; ++k) {
    sources.emplace_back(at::randn({512, 1024}), at::randint(0, 10, {512}));
    staged.push_back(stager.stage(sources.back()));
    EXPECT_TRUE(staged.back().first.is_cuda());
    sums.push_back(staged.back().first.sum());
  }
  for (int k = 0; k < 20; ++k) {
    EXPECT_TRUE(at::equal(staged[k].first.cpu(), sources[k].first)) << "batch " << k;
    EXPECT_TRUE(at::equal(staged[k].second.cpu(), sources[k].second)) << "batch " << k;
    EXPECT_TRUE(at::allclose(sums[k].cpu(), sources[k].first.sum(), 1e-4, 1e-2)) << "batch " << k;
  }
  EXPECT_EQ(stager.host_allocations(), 4u);  // two slots of two buffers, for twenty batches
}

TEST(Gpu, PreparedLoaderAllocatesNoPinnedMemoryPerBatch) {
  ACCELERATE_REQUIRE_CUDA();
  auto* host_allocator = at::getHostAllocator(at::kCUDA);
  const auto requests = [&] { return host_allocator->get_stats().active_requests.allocated; };
  const auto before_probe = requests();
  (void)at::ones({16}).pin_memory();
  ASSERT_GT(requests(), before_probe) << "the host allocator does not count requests: this test cannot see them";
  accelerate::Accelerator<> acc;
  const auto data = accelerate::testing::regression_data(64);
  auto [loader] = acc.prepare(accelerate::DataLoader(data, {.batch_size = 8}));
  const auto before = requests();
  for (int epoch = 0; epoch < 3; ++epoch) {
    int64_t row = 0;
    for (auto& [x, y] : loader) {
      ASSERT_TRUE(x.is_cuda());
      EXPECT_TRUE(at::equal(x.cpu(), data.inputs().narrow(0, row, 8))) << "epoch " << epoch << " row " << row;
      EXPECT_TRUE(at::equal(y.cpu(), data.targets().narrow(0, row, 8))) << "epoch " << epoch << " row " << row;
      row += 8;
    }
    EXPECT_EQ(row, 64);
  }
  EXPECT_LE(requests() - before, 4) << "24 batches of two tensors each";
}

}  // namespace
