// Conformance suite of the Accumulation slot (step/accumulation.hpp): laws every
// AccumulationStep<Policy> keeps. A new policy proves itself by one line in AccumulationPolicies.
#include <accelerate/step/accumulation.hpp>

#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

namespace {

using accelerate::AccumulationOptions;
using accelerate::GradientState;
using accelerate::step::AccumulationStep;

/// The policies under test, each with the options it runs with.
template <class Policy, std::size_t OptionSteps = 0>
struct Case {
  using policy = Policy;
  static AccumulationOptions options() { return {.num_steps = OptionSteps}; }
};
using AccumulationPolicies =
    ::testing::Types<Case<accelerate::NoAccumulation>, Case<accelerate::Accumulate<1>>,
                     Case<accelerate::Accumulate<3>>, Case<accelerate::Accumulate<4>, 4>,
                     Case<accelerate::AccumulateDynamic, 2>>;

template <class C>
class AccumulationStepConformance : public ::testing::Test {
 protected:
  using Step = AccumulationStep<typename C::policy>;
  static Step make() { return Step(C::options()); }

  // The boundary flags of `micro_steps` micro-steps outside any prepared loop.
  static std::vector<bool> syncs(Step& step, std::size_t micro_steps) {
    const GradientState no_loop;
    std::vector<bool> out;
    for (std::size_t i = 0; i < micro_steps; ++i) {
      step.advance(no_loop, /*sync_with_dataloader=*/true);
      out.push_back(step.sync());
    }
    return out;
  }
};
TYPED_TEST_SUITE(AccumulationStepConformance, AccumulationPolicies);

TYPED_TEST(AccumulationStepConformance, OutsideALoopEveryStepsThMicroStepIsABoundary) {
  static_assert(accelerate::AccumulationPolicy<typename TypeParam::policy>);
  auto step = this->make();
  const std::size_t n = step.steps();
  ASSERT_GE(n, 1u);
  const auto flags = this->syncs(step, 3 * n);
  for (std::size_t i = 0; i < flags.size(); ++i) EXPECT_EQ(flags[i], (i + 1) % n == 0) << "micro-step " << i;
}

TYPED_TEST(AccumulationStepConformance, AccumulatingMeansSomeMicroStepsSkipTheSync) {
  auto step = this->make();
  EXPECT_EQ(TestFixture::Step::accumulating, step.steps() > 1);
  // Off, the step state costs nothing.
  if constexpr (!TestFixture::Step::accumulating) {
    EXPECT_TRUE(std::is_empty_v<typename TestFixture::Step>);
  }
}

TYPED_TEST(AccumulationStepConformance, TheLossIsDividedByTheWindowLength) {
  auto step = this->make();
  const GradientState no_loop;
  step.advance(no_loop, true);
  const at::Tensor loss = at::full({}, 12.0);
  EXPECT_DOUBLE_EQ(at::Tensor(step.divide(loss)).item<double>(), 12.0 / static_cast<double>(step.steps()));
}

TYPED_TEST(AccumulationStepConformance, AStateDictRestoresThePositionInTheWindow) {
  auto step = this->make();
  const GradientState no_loop;
  step.advance(no_loop, true);  // one micro-step into a window
  auto restored = this->make();
  restored.load_state_dict(step.state_dict());
  EXPECT_EQ(restored.step(), step.step());
  EXPECT_EQ(restored.sync(), step.sync());
  EXPECT_EQ(this->syncs(restored, 2 * step.steps()), this->syncs(step, 2 * step.steps()));
}

// 5 batches in windows of 4: the last window holds one batch. By default its loss is divided
// by 1 (the window's mean); with LossDivisor::num_steps by 4, as Python Accelerate does.
TEST(AccumulationStep, AShortFinalWindowIsDividedByItsLengthOrByNAsAsked) {
  for (const auto divisor : {accelerate::LossDivisor::window_length, accelerate::LossDivisor::num_steps}) {
    AccumulationStep<accelerate::AccumulateDynamic> step({.num_steps = 4, .loss_divisor = divisor});
    GradientState loaders;
    GradientState::Activation epoch(loaders);
    std::vector<double> divided;
    for (std::size_t batch = 0; batch < 5; ++batch) {
      epoch.update({.at_last_batch = batch == 4, .remaining = 5 - batch});
      step.advance(loaders, /*sync_with_dataloader=*/true);
      divided.push_back(at::Tensor(step.divide(at::full({}, 12.0))).item<double>());
    }
    const double last = divisor == accelerate::LossDivisor::num_steps ? 3.0 : 12.0;
    EXPECT_EQ(divided, (std::vector<double>{3.0, 3.0, 3.0, 3.0, last}));
    EXPECT_TRUE(step.sync());  // the last batch ends the window either way
  }
}

TEST(AccumulationStep, OptionsThatContradictThePolicyAreRefused) {
  EXPECT_THROW(AccumulationStep<accelerate::NoAccumulation>({.num_steps = 4}), accelerate::Error);
  EXPECT_THROW(AccumulationStep<accelerate::Accumulate<4>>({.num_steps = 2}), accelerate::Error);
  EXPECT_THROW(AccumulationStep<accelerate::AccumulateDynamic>({.num_steps = 0}), accelerate::Error);
}

}  // namespace
