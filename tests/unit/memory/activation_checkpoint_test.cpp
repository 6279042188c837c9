// Tests of include/accelerate/memory/activation_checkpoint.hpp on one process: gradients
// bitwise equal to the same model without checkpointing (dropout on, autocast on), a block
// called twice, an exception in the recompute, in-place changes of an input, evaluation.
#include <accelerate/accelerate.hpp>
#include <accelerate/memory/activation_checkpoint.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

namespace {

struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : fc(register_module("fc", torch::nn::Linear(16, 16))),
        dropout(register_module("dropout", torch::nn::Dropout(0.3))) {}
  at::Tensor forward(const at::Tensor& x) { return x + dropout(torch::gelu(fc(x))); }
  torch::nn::Linear fc;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(Block);

struct StackImpl : torch::nn::Module {
  explicit StackImpl(bool checkpointed, bool shared = false) : checkpointed(checkpointed), shared(shared) {
    for (int i = 0; i < 4; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block()));
    head = register_module("head", torch::nn::Linear(16, 3));
  }
  at::Tensor forward(at::Tensor x) {
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      Block& block = blocks[shared ? 0 : i];
      x = checkpointed ? accelerate::activation_checkpoint(block, x) : block(x);
    }
    return head(x);
  }
  bool checkpointed, shared;
  std::vector<Block> blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Stack);

struct Gradients {
  std::vector<at::Tensor> params;
  at::Tensor input;
};

// One forward and backward from seed 3 (the same weights, inputs and dropout masks).
Gradients run(bool checkpointed, bool shared = false, bool autocast = false) {
  torch::manual_seed(3);
  Stack net(checkpointed, shared);
  at::Tensor x = torch::randn({8, 16}).requires_grad_();
  at::Tensor loss;
  if (autocast) {
    const accelerate::AutocastScope<accelerate::Bf16> scope(c10::DeviceType::CPU);
    loss = net(x).to(at::kFloat).pow(2).mean();
  } else {
    loss = net(x).pow(2).mean();
  }
  loss.backward();
  Gradients g{{}, x.grad()};
  for (const auto& p : net->parameters()) g.params.push_back(p.grad());
  return g;
}

void expect_bitwise_equal(const Gradients& a, const Gradients& b) {
  ASSERT_EQ(a.params.size(), b.params.size());
  int compared = 0;
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    ASSERT_EQ(a.params[i].defined(), b.params[i].defined()) << "parameter " << i;  // unused blocks have none
    if (!a.params[i].defined()) continue;
    EXPECT_TRUE(torch::equal(a.params[i], b.params[i])) << "parameter " << i;
    ++compared;
  }
  EXPECT_GE(compared, 4) << "at least a block's and the head's parameters";
  EXPECT_TRUE(torch::equal(a.input, b.input));
}

TEST(ActivationCheckpoint, GradientsAreBitwiseThoseWithoutItDropoutOn) {
  expect_bitwise_equal(run(true), run(false));
}

TEST(ActivationCheckpoint, ABlockCalledTwiceInOneForward) {
  expect_bitwise_equal(run(true, /*shared=*/true), run(false, /*shared=*/true));
}

TEST(ActivationCheckpoint, RecomputesUnderTheForwardsAutocast) {
  expect_bitwise_equal(run(true, false, /*autocast=*/true), run(false, false, /*autocast=*/true));
  EXPECT_FALSE(accelerate::compat::autocast_enabled(c10::DeviceType::CPU)) << "left as found";
}

TEST(ActivationCheckpoint, KeepsOnlyTheBlocksInputs) {
  torch::manual_seed(3);
  Block block;
  const at::Tensor x = torch::randn({8, 16}).requires_grad_();
  const at::Tensor y = accelerate::activation_checkpoint(block, x);
  ASSERT_TRUE(y.requires_grad());
  EXPECT_EQ(y.grad_fn()->name(), "accelerate::ActivationCheckpointBackward");
  // The node's edges lead to x (no grad_fn: a leaf's accumulator) and to the parameters.
  EXPECT_EQ(y.grad_fn()->num_outputs(), 1u + block->parameters().size());
}

TEST(ActivationCheckpoint, AnExceptionInTheRecomputeLeavesRngAndAutocastAsTheyWere) {
  torch::manual_seed(3);
  torch::nn::Linear fc(4, 4);
  int calls = 0;
  const at::Tensor x = torch::randn({2, 4}).requires_grad_();
  const at::Tensor y = accelerate::activation_checkpoint(
      fc->parameters(),
      [fc, &calls](const at::Tensor& in) mutable {
        if (++calls == 2) throw std::runtime_error("recompute failed");
        return torch::dropout(fc(in), 0.5, true);
      },
      x);
  const at::Tensor before = at::detail::getDefaultCPUGenerator().get_state();
  EXPECT_THROW(y.sum().backward(), std::exception);
  EXPECT_TRUE(torch::equal(at::detail::getDefaultCPUGenerator().get_state(), before)) << "the RNG was restored";
  EXPECT_FALSE(accelerate::compat::autocast_enabled(c10::DeviceType::CPU));
  // The model still trains afterwards.
  const at::Tensor z = accelerate::activation_checkpoint(fc, x);
  z.sum().backward();
  EXPECT_TRUE(fc->weight.grad().defined());
}

TEST(ActivationCheckpoint, RefusesAnInputChangedInPlaceBeforeBackward) {
  torch::nn::Linear fc(4, 4);
  at::Tensor x = torch::randn({2, 4});
  const at::Tensor y = accelerate::activation_checkpoint(fc, x);
  x.add_(1.0);
  try {
    y.sum().backward();
    FAIL() << "the recompute read a changed input";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("modified in place"), std::string::npos) << e.what();
  }
}

TEST(ActivationCheckpoint, ParametersGetGradientsEvenWhenNoInputNeedsOne) {
  // torch.utils.checkpoint's re-entrant form loses them here; the parameters are edges of
  // this node, so they do not.
  torch::manual_seed(3);
  torch::nn::Linear fc(4, 4);
  const at::Tensor x = torch::randn({2, 4});  // no gradient wanted
  accelerate::activation_checkpoint(fc, x).sum().backward();
  ASSERT_TRUE(fc->weight.grad().defined());
  torch::nn::Linear reference(4, 4);
  {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(fc->weight);
    reference->bias.copy_(fc->bias);
  }
  reference(x).sum().backward();
  EXPECT_TRUE(torch::equal(fc->weight.grad(), reference->weight.grad()));
}

TEST(ActivationCheckpoint, ReturnsTuplesAndIsPlainInEvaluation) {
  torch::nn::Linear fc(4, 4);
  const at::Tensor x = torch::randn({2, 4}).requires_grad_();
  auto [a, b] = accelerate::activation_checkpoint(
      fc->parameters(), [fc](const at::Tensor& in) mutable { return std::make_tuple(fc(in), in * 2); }, x);
  (a.sum() + b.sum()).backward();
  EXPECT_TRUE(torch::equal(x.grad(), (fc->weight.sum(0) + 2).expand({2, 4})));
  torch::NoGradGuard no_grad;
  const at::Tensor y = accelerate::activation_checkpoint(fc, x);
  EXPECT_FALSE(y.requires_grad());
}

}  // namespace
