// Conformance suite of the Precision slot (step/precision.hpp): laws every PrecisionStep<Policy>
// keeps on the CPU. A new policy proves itself by one line in PrecisionPolicies.
#include <accelerate/step/precision.hpp>

#include <limits>
#include <type_traits>

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

namespace {

using accelerate::step::PrecisionStep;

using PrecisionPolicies = ::testing::Types<accelerate::Fp32, accelerate::Bf16, accelerate::Fp16>;

template <class P>
class PrecisionStepConformance : public ::testing::Test {
 protected:
  using Step = PrecisionStep<P>;
  PrecisionStepConformance() {
    torch::manual_seed(7);
    net = torch::nn::Linear(4, 3);
    sgd = std::make_unique<torch::optim::SGD>(net->parameters(), 0.1);
  }
  at::Tensor loss() { return net(torch::randn({5, 4})).pow(2).sum(); }
  std::vector<at::Tensor> grads() {
    std::vector<at::Tensor> out;
    for (const auto& p : net->parameters()) out.push_back(p.grad().clone());
    return out;
  }

  const c10::Device cpu{c10::kCPU};
  torch::nn::Linear net{nullptr};
  std::unique_ptr<torch::optim::SGD> sgd;
};
TYPED_TEST_SUITE(PrecisionStepConformance, PrecisionPolicies);

TYPED_TEST(PrecisionStepConformance, UnscaledGradientsAreThoseOfThePlainLoss) {
  static_assert(accelerate::PrecisionPolicy<TypeParam>);
  typename TestFixture::Step step({}, this->cpu);
  auto slot = step.add_optimizer(*this->sgd);
  torch::manual_seed(1);
  this->loss().backward();
  const auto plain = this->grads();
  this->sgd->zero_grad();
  torch::manual_seed(1);
  at::Tensor(step.scale(this->loss())).backward();
  step.unscale(slot);
  step.unscale(slot);  // once per step, however often asked
  const auto unscaled = this->grads();
  for (std::size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::allclose(unscaled[i], plain[i])) << "parameter " << i;
}

TYPED_TEST(PrecisionStepConformance, FiniteGradientsStepAndAreNotSkipped) {
  typename TestFixture::Step step({}, this->cpu);
  auto slot = step.add_optimizer(*this->sgd);
  at::Tensor(step.scale(this->loss())).backward();
  step.unscale(slot);
  int steps = 0;
  step.step(slot, [&] { ++steps; });
  EXPECT_EQ(steps, 1);
  EXPECT_FALSE(step.step_skipped());
  EXPECT_FALSE(TestFixture::Step::skipped(slot));
}

TYPED_TEST(PrecisionStepConformance, ANonFiniteGradientIsSkippedExactlyWhenTheLossIsScaled) {
  typename TestFixture::Step step({}, this->cpu);
  auto slot = step.add_optimizer(*this->sgd);
  at::Tensor(step.scale(this->loss())).backward();
  this->net->weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
  step.unscale(slot);
  int steps = 0;
  step.step(slot, [&] { ++steps; });
  EXPECT_EQ(steps, TestFixture::Step::scales_loss ? 0 : 1);
  EXPECT_EQ(step.step_skipped(), TestFixture::Step::scales_loss);
}

TYPED_TEST(PrecisionStepConformance, ItsCheckpointStateIsRegisteredWhenItHasAny) {
  typename TestFixture::Step step({}, this->cpu);
  accelerate::checkpoint::Registry registry;
  step.register_state(registry);
  EXPECT_EQ(registry.step_states().size(), TestFixture::Step::scales_loss ? 1u : 0u);
  // An autocast-only policy is an empty type: it costs its accelerator nothing.
  if constexpr (!TestFixture::Step::scales_loss) {
    EXPECT_TRUE(std::is_empty_v<typename TestFixture::Step>);
  }
}

}  // namespace
