// Tests of include/accelerate/optim/fused_adam.hpp: FusedAdam and FusedAdamW step as
// torch::optim's Adam and AdamW do (every option, 100 steps), their states move both ways
// between them, bf16 moments, and the loss scale folded into the kernel under Fp16.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <sstream>

namespace {

using accelerate::FusedAdam;
using accelerate::FusedAdamW;

constexpr int kParams = 5;

// Parameters of a few shapes (a matrix, a vector, a scalar-like one), the same values twice.
std::vector<at::Tensor> make_params(int seed) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> params;
  for (int i = 0; i < kParams; ++i) {
    const std::vector<int64_t> shape = i % 3 == 0 ? std::vector<int64_t>{7, 3} : i % 3 == 1 ? std::vector<int64_t>{11}
                                                                                          : std::vector<int64_t>{1};
    params.push_back(torch::randn(shape).requires_grad_());
  }
  return params;
}
std::vector<at::Tensor> clone_params(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

// Gives both parameter lists the same random gradients (times `sign` for the second) and steps
// both optimizers, `steps` times; parameter 1 misses every third gradient (its step count lags).
void step_both(torch::optim::Optimizer& a, std::vector<at::Tensor>& pa, torch::optim::Optimizer& b,
               std::vector<at::Tensor>& pb, int steps, double sign = 1.0) {
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < kParams; ++i) {
      if (i == 1 && s % 3 == 2) {
        pa[i].mutable_grad().reset();
        pb[i].mutable_grad().reset();
        continue;
      }
      const auto g = torch::randn_like(pa[i]);
      pa[i].mutable_grad() = g.clone();
      pb[i].mutable_grad() = g * sign;
    }
    a.step();
    b.step();
  }
}

double max_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
}

struct AdamCase {
  bool decoupled;
  double weight_decay;
  bool amsgrad;
};

class FusedAdamAgrees : public ::testing::TestWithParam<AdamCase> {};

TEST_P(FusedAdamAgrees, WithTorchOptimOverAHundredSteps) {
  const AdamCase c = GetParam();
  auto fused_params = make_params(1);
  auto torch_params = clone_params(fused_params);
  std::unique_ptr<torch::optim::Optimizer> fused, reference;
  if (c.decoupled) {
    const auto options = torch::optim::AdamWOptions(0.01).weight_decay(c.weight_decay).amsgrad(c.amsgrad).betas({0.8, 0.99});
    fused = std::make_unique<FusedAdamW>(fused_params, options);
    reference = std::make_unique<torch::optim::AdamW>(torch_params, options);
  } else {
    const auto options = torch::optim::AdamOptions(0.01).weight_decay(c.weight_decay).amsgrad(c.amsgrad).betas({0.8, 0.99});
    fused = std::make_unique<FusedAdam>(fused_params, options);
    reference = std::make_unique<torch::optim::Adam>(torch_params, options);
  }
  step_both(*fused, fused_params, *reference, torch_params, 100);
  EXPECT_LE(max_difference(fused_params, torch_params), 1e-6);
  EXPECT_GT((fused_params[0] - make_params(1)[0]).abs().max().item<double>(), 0.1) << "it trained";
}

INSTANTIATE_TEST_SUITE_P(EveryOption, FusedAdamAgrees,
                         ::testing::Values(AdamCase{true, 0.0, false}, AdamCase{true, 0.1, false},
                                           AdamCase{true, 0.1, true}, AdamCase{false, 0.0, false},
                                           AdamCase{false, 0.1, false}, AdamCase{false, 0.1, true}),
                         [](const auto& info) {
                           return std::string(info.param.decoupled ? "AdamW" : "Adam") +
                                  (info.param.weight_decay > 0 ? "_decay" : "") + (info.param.amsgrad ? "_amsgrad" : "");
                         });

TEST(FusedAdamW, MaximizeIsMinimizingTheNegatedObjective) {
  auto fused_params = make_params(2);
  auto torch_params = clone_params(fused_params);
  const auto options = torch::optim::AdamWOptions(0.01).weight_decay(0.1);
  FusedAdamW fused(fused_params, options, {.maximize = true});
  torch::optim::AdamW reference(torch_params, options);
  step_both(fused, fused_params, reference, torch_params, 100, /*sign=*/-1.0);
  EXPECT_LE(max_difference(fused_params, torch_params), 1e-6);
}

TEST(FusedAdamW, StateMovesToAndFromTorchOptimThroughCheckpointsAndArchives) {
  auto p1 = make_params(3);
  auto p2 = clone_params(p1);
  const auto options = torch::optim::AdamWOptions(0.01).weight_decay(0.1).amsgrad(true);
  FusedAdamW fused(p1, options);
  torch::optim::AdamW reference(p2, options);
  step_both(fused, p1, reference, p2, 10);

  // Fused -> torch::optim through the library's checkpoint encoding, torch::optim -> fused
  // through LibTorch's own archive; then both continue and still agree.
  auto q1 = clone_params(p1);
  auto q2 = clone_params(p2);
  torch::optim::AdamW from_fused(q2, options);
  accelerate::checkpoint::load_optimizer_state_dict(from_fused, accelerate::checkpoint::optimizer_state_dict(fused));
  std::stringstream archive;
  torch::save(reference, archive);
  FusedAdamW from_torch(q1, options);
  torch::load(from_torch, archive);
  EXPECT_EQ(accelerate::checkpoint::optimizer_state_dict(from_torch).values,
            accelerate::checkpoint::optimizer_state_dict(reference).values);

  torch::manual_seed(77);
  step_both(from_torch, q1, from_fused, q2, 10);
  torch::manual_seed(77);
  step_both(fused, p1, reference, p2, 10);
  EXPECT_LE(max_difference(q1, p1), 1e-6);
  EXPECT_LE(max_difference(q2, p2), 1e-6);
  EXPECT_LE(max_difference(q1, q2), 1e-6);
}

TEST(FusedAdamW, KeepsBf16MomentsInHalfTheMemoryAndStaysClose) {
  auto p1 = make_params(4);
  auto p2 = clone_params(p1);
  const auto options = torch::optim::AdamWOptions(0.01).amsgrad(true);
  FusedAdamW narrow(p1, options, {.moments_dtype = at::kBFloat16, .chunk_elements = 16});  // several chunks
  FusedAdamW wide(p2, options);
  step_both(narrow, p1, wide, p2, 100);
  int64_t narrow_bytes = 0, wide_bytes = 0;
  for (int i = 0; i < kParams; ++i) {
    const auto& n = static_cast<torch::optim::AdamWParamState&>(*narrow.state().at(p1[i].unsafeGetTensorImpl()));
    const auto& w = static_cast<torch::optim::AdamWParamState&>(*wide.state().at(p2[i].unsafeGetTensorImpl()));
    EXPECT_EQ(n.exp_avg().scalar_type(), at::kBFloat16);
    EXPECT_EQ(n.max_exp_avg_sq().scalar_type(), at::kBFloat16);
    narrow_bytes += n.exp_avg().nbytes() + n.exp_avg_sq().nbytes();
    wide_bytes += w.exp_avg().nbytes() + w.exp_avg_sq().nbytes();
  }
  EXPECT_EQ(2 * narrow_bytes, wide_bytes);
  // bf16 keeps 8 bits of mantissa: the moments round at 0.4%, the parameters move by lr-sized
  // steps, so after 100 steps of lr 0.01 they agree to a few hundredths, not 1e-6.
  const double difference = max_difference(p1, p2);
  EXPECT_LE(difference, 0.05);
  EXPECT_GT(difference, 0.0) << "the moments really were rounded";
}

TEST(FusedAdamW, DividesByAScaleInsideTheKernelOnceOnly) {
  auto p1 = make_params(5);
  auto p2 = clone_params(p1);
  FusedAdamW scaled(p1, torch::optim::AdamWOptions(0.01));
  torch::optim::AdamW reference(p2, torch::optim::AdamWOptions(0.01));
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < kParams; ++i) {
      const auto g = torch::randn_like(p1[i]);
      p1[i].mutable_grad() = g * 1024.0;
      p2[i].mutable_grad() = g.clone();
    }
    if (s < 2) scaled.unscale_in_next_step(torch::full({1}, 1024.0));
    else for (auto& p : p1) p.mutable_grad().div_(1024.0);  // the scale was consumed by the last step
    scaled.step();
    reference.step();
  }
  EXPECT_LE(max_difference(p1, p2), 1e-6);
}

TEST(FusedAdamW, RefusesANonPositiveChunk) {
  auto params = make_params(6);
  FusedAdamW adamw(params, torch::optim::AdamWOptions(0.01), {.moments_dtype = at::kBFloat16, .chunk_elements = 0});
  for (auto& p : params) p.mutable_grad() = torch::ones_like(p);
  EXPECT_THROW(adamw.step(), accelerate::Error);
}

// Trains the same model under Fp16 with `Optimizer` and returns its parameters; the first
// steps overflow (a scale of 2^40) and are skipped.
template <class Optimizer, class Acc>
std::pair<at::Tensor, int> train_fp16() {
  Acc acc{{.cpu = true, .precision = {.grad_scaler = {.init_scale = 1099511627776.0, .growth_interval = 3}}}};
  torch::manual_seed(9);
  torch::nn::Sequential net(torch::nn::Linear(6, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
  Optimizer optimizer(net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.05));
  auto [model, opt] = acc.prepare(net, optimizer);
  int skipped = 0;
  for (int s = 0; s < 30; ++s) {
    const auto x = torch::randn({8, 6});
    acc.backward(model(x).pow(2).mean());
    opt.step();
    skipped += opt.step_was_skipped();
    opt.zero_grad();
  }
  std::vector<at::Tensor> flat;
  for (const auto& p : net->parameters()) flat.push_back(p.detach().reshape(-1));
  return {torch::cat(flat), skipped};
}

TEST(FusedAdamW, UnderFp16TakesTheScaleIntoItsKernelAndSkipsLikeTorchOptim) {
  static_assert(accelerate::step::UnscalesInStep<FusedAdamW>);
  static_assert(!accelerate::step::UnscalesInStep<torch::optim::AdamW>);
  using Acc = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp16>;
  const auto [fused, fused_skipped] = train_fp16<FusedAdamW, Acc>();
  const auto [reference, reference_skipped] = train_fp16<torch::optim::AdamW, Acc>();
  EXPECT_GT(fused_skipped, 0) << "the overflowing steps were skipped";
  EXPECT_EQ(fused_skipped, reference_skipped);
  EXPECT_LE((fused - reference).abs().max().item<double>(), 1e-6);
  // With a Clip policy the gradients are unscaled before clipping and the kernel gets no scale.
  using Clipped = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp16, accelerate::NoAccumulation,
                                          accelerate::ClipNorm<>>;
  const auto [clipped_fused, s1] = train_fp16<FusedAdamW, Clipped>();
  const auto [clipped_reference, s2] = train_fp16<torch::optim::AdamW, Clipped>();
  EXPECT_EQ(s1, s2);
  EXPECT_LE((clipped_fused - clipped_reference).abs().max().item<double>(), 1e-6);
}

}  // namespace
