// Conformance suite of the Clip slot (step/clip.hpp): laws every ClipStep<Policy> keeps, run
// through the single-process engine. A new policy proves itself by one line in ClipPolicies.
#include <accelerate/step/clip.hpp>

#include <limits>
#include <type_traits>

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <accelerate/distributed/local_engine.hpp>
#include <accelerate/policy/backend.hpp>
#include <accelerate/policy/precision.hpp>

namespace {

using accelerate::ClipOptions;
using accelerate::step::ClipStep;

using ClipPolicies = ::testing::Types<accelerate::NoClip, accelerate::ClipNorm<>, accelerate::ClipNormInf,
                                      accelerate::ClipValue>;

template <class C>
class ClipStepConformance : public ::testing::Test {
 protected:
  using Step = ClipStep<C>;
  ClipStepConformance() : engine({}, "") {
    net = torch::nn::Linear(6, 5);
    sgd = std::make_unique<torch::optim::SGD>(net->parameters(), 0.1);
  }
  // Gradients of a known size: every element `scale` times a fixed pattern in [-1, 1].
  void set_gradients(double scale) {
    for (auto& p : net->parameters())
      p.mutable_grad() = torch::linspace(-1.0, 1.0, p.numel()).reshape(p.sizes()) * scale;
  }
  at::Tensor flat_gradients() {
    std::vector<at::Tensor> parts;
    for (const auto& p : net->parameters()) parts.push_back(p.grad().flatten());
    return torch::cat(parts);
  }
  void apply(Step& step, const ClipOptions& options) { step.apply(engine, *sgd, options); }

  accelerate::distributed::LocalEngine engine;
  torch::nn::Linear net{nullptr};
  std::unique_ptr<torch::optim::SGD> sgd;
};
TYPED_TEST_SUITE(ClipStepConformance, ClipPolicies);

// Another slot's policy is not a Clip policy, however few facts a Clip policy has.
static_assert(!accelerate::ClipPolicy<accelerate::Gloo> && !accelerate::ClipPolicy<accelerate::Fp32>);

TYPED_TEST(ClipStepConformance, GradientsWithinEveryThresholdAreLeftAlone) {
  static_assert(accelerate::ClipPolicy<TypeParam>);
  typename TestFixture::Step step;
  this->set_gradients(1e-3);
  const auto before = this->flat_gradients();
  this->apply(step, {.max_norm = 10.0, .clip_value = 10.0});
  EXPECT_TRUE(torch::equal(this->flat_gradients(), before));
}

TYPED_TEST(ClipStepConformance, NoElementGrowsAndClippingTwiceIsClippingOnce) {
  typename TestFixture::Step step;
  this->set_gradients(100.0);
  const auto before = this->flat_gradients();
  const ClipOptions tight{.max_norm = 0.5, .clip_value = 0.5};
  this->apply(step, tight);
  const auto once = this->flat_gradients();
  EXPECT_TRUE((once.abs() <= before.abs() + 1e-6).all().template item<bool>());
  this->apply(step, tight);
  EXPECT_TRUE(torch::allclose(this->flat_gradients(), once, /*rtol=*/1e-5, /*atol=*/1e-7));
  // A policy that clips changes these gradients; one that does not is an empty type.
  EXPECT_EQ(!torch::equal(once, before), TestFixture::Step::active);
  if constexpr (!TestFixture::Step::active) {
    EXPECT_TRUE(std::is_empty_v<typename TestFixture::Step>);
  }
}

TEST(ClipStep, ClipNormRemembersThePreClipNormAndMeetsTheBound) {
  ClipStep<accelerate::ClipNorm<>> step;
  accelerate::distributed::LocalEngine engine({}, "");
  torch::nn::Linear net(2, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  for (auto& p : net->parameters()) p.mutable_grad() = torch::full_like(p, 3.0);
  step.apply(engine, sgd, {.max_norm = 1.0});
  EXPECT_NEAR(step.last_norm(), std::sqrt(6.0 * 9.0), 1e-5);  // 6 gradient elements of 3
  double norm = 0;
  for (const auto& p : net->parameters()) norm += p.grad().pow(2).sum().item<double>();
  EXPECT_LE(std::sqrt(norm), 1.0 + 1e-5);
}

// The largest double as the bound means "measure the norm, never scale" (what a run that clips
// only sometimes passes); LibTorch's clip_grad_norm_ divides the bound by a float tensor and
// refused it ("value cannot be converted to type float without overflow") under one process
// and data parallel, while the sharded engines took it.
TEST(ClipStep, ClipNormWithABoundBeyondFloatsRangeMeasuresAndNeverScales) {
  ClipStep<accelerate::ClipNorm<>> step;
  accelerate::distributed::LocalEngine engine({}, "");
  torch::nn::Linear net(2, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  for (auto& p : net->parameters()) p.mutable_grad() = torch::full_like(p, 3.0);
  step.apply(engine, sgd, {.max_norm = std::numeric_limits<double>::max()});
  EXPECT_NEAR(step.last_norm(), std::sqrt(6.0 * 9.0), 1e-5);
  for (const auto& p : net->parameters()) EXPECT_TRUE(torch::equal(p.grad(), torch::full_like(p, 3.0)));
}

TEST(ClipStep, ClipValueBoundsEveryElement) {
  ClipStep<accelerate::ClipValue> step;
  accelerate::distributed::LocalEngine engine({}, "");
  torch::nn::Linear net(2, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  for (auto& p : net->parameters()) p.mutable_grad() = torch::full_like(p, -3.0);
  step.apply(engine, sgd, {.clip_value = 0.25});
  for (const auto& p : net->parameters()) EXPECT_LE(p.grad().abs().max().item<double>(), 0.25);
}

}  // namespace
