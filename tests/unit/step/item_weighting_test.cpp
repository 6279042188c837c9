// Tests of include/accelerate/step/item_weighting.hpp through Accelerator::backward(loss,
// {.num_items}) on one process: the window's gradient is the mean over its tokens, a window
// mixing counted and plain losses is refused, and a window's count survives a checkpoint.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include "../../support/temp_dir.hpp"
#include "../../support/token_batches.hpp"

namespace {

using namespace accelerate::testing;

constexpr int kMicro = 4;
using Acc = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::Accumulate<kMicro>>;

torch::Tensor flat_grads(const torch::nn::Module& module) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : module.parameters()) parts.push_back(p.grad().reshape(-1));
  return torch::cat(parts);
}

// One window of token micro-batches through backward(loss_sum, {.num_items}); with
// `clip_first` a user's clip_grad_norm_ reads the gradients before each opt.step(). Returns
// the gradient the boundary's step saw.
torch::Tensor weighted_window(bool clip_first) {
  Acc acc{{.cpu = true}};
  auto head = token_head();
  torch::optim::SGD sgd(head->parameters(), 0.1);
  auto [model, opt] = acc.prepare(head, sgd);
  torch::Tensor seen;
  for (int m = 0; m < kMicro; ++m) {
    auto step = acc.accumulate(model);
    const TokenBatch batch = token_batch(m, 0);
    acc.backward(token_loss_sum(model(batch.x), batch), {.num_items = token_count(batch)});
    if (clip_first) acc.clip_grad_norm_(head->parameters(), 1e9);  // weighs at the boundary
    opt.step();                                                     // and this must not again
    if (step.sync_gradients()) seen = flat_grads(*head);
    opt.zero_grad();
  }
  return seen;
}

TEST(ItemWeighting, GivesTheTokenMeanOfTheWholeWindow) {
  const auto seen = weighted_window(/*clip_first=*/false);
  ASSERT_TRUE(seen.defined());
  const auto token_mean = window_gradient(kMicro, 1, /*token_mean=*/true);
  const auto batch_mean = window_gradient(kMicro, 1, /*token_mean=*/false);
  EXPECT_LE((seen - token_mean).abs().max().item<double>(), 1e-6);
  EXPECT_GT((batch_mean - token_mean).abs().max().item<double>(), 1e-2)
      << "the per-micro-batch mean is a different gradient, so the check above can fail";
}

TEST(ItemWeighting, WeighsBeforeAUsersClipAndOnlyOnce) {
  EXPECT_LE((weighted_window(/*clip_first=*/true) - window_gradient(kMicro, 1, true)).abs().max().item<double>(), 1e-6);
}

TEST(ItemWeighting, RefusesAWindowMixingCountedAndPlainLosses) {
  Acc acc{{.cpu = true}};
  auto head = token_head();
  auto [model] = acc.prepare(head);
  const TokenBatch batch = token_batch(0, 0);
  {
    auto step = acc.accumulate(model);
    acc.backward(token_loss_sum(model(batch.x), batch), {.num_items = token_count(batch)});
  }
  auto step = acc.accumulate(model);
  try {
    acc.backward(token_loss_sum(model(batch.x), batch) / 3.0);
    FAIL() << "a plain backward in a counted window was accepted";
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("mixes losses with num_items"), std::string::npos) << e.what();
  }
  EXPECT_THROW(acc.backward(token_loss_sum(model(batch.x), batch), {.num_items = -1}), accelerate::Error);
}

TEST(ItemWeighting, RefusesAWindowOfNoItems) {
  Acc acc{{.cpu = true}};
  auto head = token_head();
  torch::optim::SGD sgd(head->parameters(), 0.1);
  auto [model, opt] = acc.prepare(head, sgd);
  const TokenBatch batch = token_batch(0, 0);
  for (int m = 0; m < kMicro - 1; ++m) {
    auto step = acc.accumulate(model);
    acc.backward(token_loss_sum(model(batch.x), batch) * 0.0, {.num_items = 0});
    opt.step();
  }
  auto step = acc.accumulate(model);
  acc.backward(token_loss_sum(model(batch.x), batch) * 0.0, {.num_items = 0});
  try {
    opt.step();
    FAIL() << "a window of no items was stepped";
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sum to 0"), std::string::npos) << e.what();
  }
}

// Accelerator<SingleProcess>: no window and the optimizer's own step(); each backward is its
// own window, divided at once (and 0 items refused there).
TEST(ItemWeighting, WithoutAWindowDividesEachLossByItsItems) {
  accelerate::Accelerator<accelerate::SingleProcess> acc{{.cpu = true}};
  static_assert(decltype(acc)::context_type::plain_optimizer_step);
  auto head = token_head();
  torch::optim::SGD sgd(head->parameters(), 0.1);
  auto [model, opt] = acc.prepare(head, sgd);
  const TokenBatch batch = token_batch(1, 0);
  acc.backward(token_loss_sum(model(batch.x), batch), {.num_items = token_count(batch)});
  const auto seen = flat_grads(*head);
  torch::nn::Linear reference = token_head();
  (token_loss_sum(reference(batch.x), batch) / static_cast<double>(token_count(batch))).backward();
  EXPECT_LE((seen - flat_grads(*reference)).abs().max().item<double>(), 1e-6);
  EXPECT_THROW(acc.backward(token_loss_sum(model(batch.x), batch), {.num_items = 0}), accelerate::Error);
}

TEST(ItemWeighting, AWindowsCountSurvivesACheckpointTakenInsideIt) {
  TempDir dir;
  const auto run = [&](bool resume) {
    Acc acc{{.cpu = true}};
    auto head = token_head();
    torch::optim::SGD sgd(head->parameters(), 0.1);
    auto [model, opt] = acc.prepare(head, sgd);
    int first = 0;
    if (resume) {
      acc.load_state(dir.path());
      first = 2;
    }
    torch::Tensor seen;
    for (int m = first; m < kMicro; ++m) {
      auto step = acc.accumulate(model);
      const TokenBatch batch = token_batch(m, 0);
      acc.backward(token_loss_sum(model(batch.x), batch), {.num_items = token_count(batch)});
      opt.step();
      if (step.sync_gradients()) seen = flat_grads(*head);
      if (!resume && m == 1) acc.save_state(dir.path());  // mid-window: gradients are not saved,
    }
    return seen;
  };
  run(false);
  // Resumed after micro-step 1 with fresh (zero) gradients, the last two micro-batches are
  // weighed by the whole window's count, which includes the first two.
  const auto resumed = run(true);
  torch::nn::Linear head = token_head();
  int64_t tokens = 0;
  for (int m = 0; m < kMicro; ++m) tokens += token_count(token_batch(m, 0));
  for (int m = 2; m < kMicro; ++m) {
    const TokenBatch batch = token_batch(m, 0);
    (token_loss_sum(head(batch.x), batch) / static_cast<double>(tokens)).backward();
  }
  EXPECT_LE((resumed - flat_grads(*head)).abs().max().item<double>(), 1e-6);
}

}  // namespace
