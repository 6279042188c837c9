// Tests of include/accelerate/distributed/parameter_units.hpp: which unit each parameter joins,
// and the life of a unit's parameters (cut, gathered, released, freed as its gradients come
// in) in one process over a real one-rank Gloo group. What several ranks see is tested through
// the ZeRO-3 engine (tests/distributed/sharded_test.cpp).
#include <accelerate/compat/c10d.hpp>
#include <accelerate/distributed/parameter_units.hpp>

#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

namespace {

using accelerate::distributed::BucketedParameter;
using accelerate::distributed::BucketLayout;
using accelerate::distributed::BuiltSlice;
using accelerate::distributed::Communicator;
using accelerate::distributed::ParameterUnits;

std::shared_ptr<Communicator> one_rank_gloo() {
  const auto timeout = std::chrono::milliseconds(30000);
  auto store = accelerate::compat::make_tcp_store("127.0.0.1", 0, /*is_server=*/true, 1, timeout);
  return std::make_shared<Communicator>(accelerate::compat::make_gloo_backend(store, 0, 1, timeout, "127.0.0.1", ""),
                                        0, 1);
}

TEST(ParameterUnits, EachParameterJoinsTheFirstUnitWhosePrefixNamesIt) {
  ParameterUnits units({"encoder", "head"}, {}, /*prefetch=*/true);
  units.assign({"encoder.weight", "head.bias", "bias", "encoderx.weight", "encoder.inner.weight"});
  EXPECT_EQ(units.unit_count(), 3u);  // the two listed, then the rest
  EXPECT_EQ(units.unit_of(0), 0u);
  EXPECT_EQ(units.unit_of(1), 1u);
  EXPECT_EQ(units.unit_of(2), 2u);
  EXPECT_EQ(units.unit_of(3), 2u);  // "encoderx" is not inside "encoder"
  EXPECT_EQ(units.unit_of(4), 0u);
  EXPECT_EQ(units.unit_parameters(0), (std::vector<std::size_t>{0, 4}));
}

// Two units of two parameters each, one bucket per unit, over one rank.
struct TwoUnits {
  std::vector<at::Tensor> params = {torch::randn({3, 2}, torch::requires_grad()),
                                    torch::randn({2}, torch::requires_grad()),
                                    torch::randn({4}, torch::requires_grad()),
                                    torch::randn({1, 5}, torch::requires_grad())};
  std::vector<at::Tensor> values;  // the parameters as built
  std::shared_ptr<ParameterUnits> units;

  explicit TwoUnits(bool prefetch = true) {
    for (const auto& p : params) values.push_back(p.detach().clone());
    units = std::make_shared<ParameterUnits>(std::vector<std::string>{"a", "b"},
                                             std::unordered_map<const c10::TensorImpl*, BuiltSlice>{}, prefetch);
    units->assign({"a.w", "a.b", "b.w", "b.v"});
    std::vector<BucketedParameter> bucketed;
    std::vector<std::vector<int64_t>> shapes;
    for (std::size_t i = 0; i < params.size(); ++i) {
      bucketed.push_back({params[i].numel(), 4, {}, units->unit_of(i)});
      shapes.emplace_back(params[i].sizes().begin(), params[i].sizes().end());
    }
    BucketLayout layout(bucketed, 1 << 20, 1 << 20, 1);
    const std::vector<at::TensorOptions> options(layout.size(), at::TensorOptions(at::kFloat));
    units->shard(layout, params, shapes, options, one_rank_gloo(), [](std::size_t) {});
  }

  bool whole(std::size_t i) const { return params[i].sizes() == values[i].sizes() && torch::equal(params[i], values[i]); }
};

// Runs `report` each time backward has accumulated a gradient into `param`'s .grad, while
// the node returned is kept (a tensor holds its accumulator weakly).
std::shared_ptr<torch::autograd::Node> after_accumulation(const at::Tensor& param, std::function<void()> report) {
  struct Report : torch::autograd::FunctionPostHook {
    explicit Report(std::function<void()> f) : report(std::move(f)) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list&) override {
      report();
      return outputs;
    }
    std::function<void()> report;
  };
  auto accumulator = torch::autograd::impl::grad_accumulator(param);
  accumulator->add_post_hook(std::make_unique<Report>(std::move(report)));
  return accumulator;
}

TEST(ParameterUnits, CutParametersAreEmptyUntilTheirUnitIsGatheredAndEmptyAgainOnceReleased) {
  TwoUnits model;
  for (const auto& p : model.params) EXPECT_EQ(p.numel(), 0);
  EXPECT_FALSE(model.units->unit_gathered(0));
  model.units->gather_unit(0);
  EXPECT_TRUE(model.units->unit_gathered(0));
  EXPECT_TRUE(model.whole(0) && model.whole(1));
  EXPECT_EQ(model.params[2].numel(), 0);  // the other unit stays released
  model.units->release_unit(0);
  EXPECT_EQ(model.params[0].numel(), 0);
  model.units->prefetch_unit(1);  // started, then waited for
  model.units->gather_unit(1);
  EXPECT_TRUE(model.whole(2) && model.whole(3));
  model.units->release_units();
  for (const auto& p : model.params) EXPECT_EQ(p.numel(), 0);
}

TEST(ParameterUnits, AUnitIsFreedOnceEveryOneOfItsGradientsIsInAndTheRestWhenBackwardEnds) {
  TwoUnits model;
  model.units->gather_unit(0);
  model.units->gather_unit(1);
  // Unit "a"'s gradients are reported once accumulated (as the reducer's hooks do); unit "b"'s
  // never are.
  std::vector<std::pair<bool, bool>> gathered;  // (unit a, unit b) after each report
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  for (std::size_t i = 0; i < 2; ++i)
    accumulators.push_back(after_accumulation(model.params[i], [&, i] {
      model.units->gradient_arrived(i);
      gathered.emplace_back(model.units->unit_gathered(0), model.units->unit_gathered(1));
    }));
  at::Tensor loss = model.params[0].sum() + model.params[1].sum() + model.params[2].sum() + model.params[3].sum();
  loss.backward();
  ASSERT_EQ(gathered.size(), 2u);
  EXPECT_TRUE(gathered[0].first);    // one of its two gradients in: still gathered
  EXPECT_FALSE(gathered[1].first);   // both in: freed while backward goes on
  EXPECT_TRUE(gathered[1].second);   // unit b: gathered until backward ends,
  EXPECT_FALSE(model.units->unit_gathered(1));  // then freed
  EXPECT_EQ(model.params[2].numel(), 0);
}

TEST(ParameterUnits, ABackwardThatThrewLeavesItsUnitsToTheNextRecovery) {
  TwoUnits model;
  model.units->gather_unit(0);
  model.units->gather_unit(1);
  // The hook on `partial` runs before any hook on the parameter it comes from.
  at::Tensor partial = model.params[0].sum();
  partial.register_hook([&](const at::Tensor& grad) {
    model.units->gradient_arrived(0);
    return grad;
  });
  model.params[0].register_hook([](const at::Tensor&) -> at::Tensor { throw std::runtime_error("out of memory"); });
  at::Tensor loss = partial + model.params[2].sum();
  EXPECT_THROW(loss.backward(), std::exception);
  EXPECT_TRUE(model.units->unit_gathered(1));  // the end of that backward never came
  model.units->recover_abandoned_backward();
  EXPECT_FALSE(model.units->unit_gathered(0));
  EXPECT_FALSE(model.units->unit_gathered(1));
  model.units->gather_unit(0);
  model.units->recover_abandoned_backward();  // nothing abandoned since: nothing happens
  EXPECT_TRUE(model.units->unit_gathered(0));
}

TEST(ParameterUnits, AParameterCutAsItWasBuiltIsMadeWholeFromItsSlice) {
  at::Tensor param = torch::zeros({0}, torch::requires_grad());  // emptied when cut
  const at::Tensor values = torch::arange(6, torch::kFloat).reshape({2, 3});
  std::unordered_map<const c10::TensorImpl*, BuiltSlice> built;
  built[param.unsafeGetTensorImpl()] = {{2, 3}, values.reshape(-1).clone()};  // one rank: all of it
  auto units = std::make_shared<ParameterUnits>(std::vector<std::string>{}, std::move(built), true);
  ASSERT_NE(units->built_shape(param), nullptr);
  EXPECT_EQ(*units->built_shape(param), (std::vector<int64_t>{2, 3}));
  units->assign({"w"});
  BucketLayout layout({{6, 4, {}, 0}}, 1 << 20, 1 << 20, 1);
  std::vector<std::size_t> made_whole;
  units->shard(layout, {param}, {{2, 3}}, {at::TensorOptions(at::kFloat)}, one_rank_gloo(),
               [&](std::size_t index) { made_whole.push_back(index); });
  EXPECT_EQ(made_whole, (std::vector<std::size_t>{0}));
  EXPECT_EQ(units->built_shape(param), nullptr);  // its slice was used up
  units->gather_unit(0);
  EXPECT_TRUE(torch::equal(param, values));
}

}  // namespace
