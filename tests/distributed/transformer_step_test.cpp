// What transformer training adds to the step, on real ranks: FusedAdamW stepping each ZeRO
// stage's slices (and taking the Fp16 scale into its kernel) as torch::optim::AdamW does,
// token-weighted losses giving the mean over every token of the window on every rank, and
// activation checkpointing training every Backend to the parameters it trains without it.
#include <accelerate/accelerate.hpp>
#include <accelerate/distributed/sharded.hpp>
#include <accelerate/memory/activation_checkpoint.hpp>

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "../support/prelude.hpp"
#include "../support/token_batches.hpp"

namespace {

using namespace accelerate::testing::prelude;
using accelerate::testing::token_batch;
using accelerate::testing::token_count;
using accelerate::testing::token_head;
using accelerate::testing::token_loss_sum;
using accelerate::testing::TokenBatch;

constexpr int kSteps = 10, kMicro = 4;

// The model's whole parameters on every rank (stage 3 keeps none whole between steps).
template <class Acc, class Model>
torch::Tensor whole_parameters(Acc& acc, Model& model) {
  const auto state = acc.get_state_dict(model);
  std::vector<torch::Tensor> flat;
  for (const auto& [name, tensor] : accelerate::checkpoint::named_tensors(*model)) flat.push_back(state.at(name).reshape(-1));
  return torch::cat(flat);
}

// kSteps optimizer steps of a 6 -> 3 regression, 4 samples per rank and step.
template <class Acc, class Model, class Optimizer>
void regression_steps(Acc& acc, Model& model, Optimizer& opt) {
  const auto data = accelerate::testing::regression_data(kSteps * 4 * acc.num_processes(), 6, 3);
  for (int s = 0; s < kSteps; ++s) {
    const int64_t start = (static_cast<int64_t>(s) * acc.num_processes() + acc.process_index()) * 4;
    acc.backward(torch::mse_loss(model(data.inputs().narrow(0, start, 4)), data.targets().narrow(0, start, 4)));
    opt.step();
    opt.zero_grad();
  }
}

// kSteps of AdamW (weight decay, amsgrad) with `Optimizer` under Backend and Precision; saves
// the parameters as <tag>_rank<r>.bin.
template <class Backend, class Precision, class Optimizer>
void train_adamw(const std::string& tag) {
  accelerate::Accelerator<Backend, Precision> acc{{.process_group = {.timeout = 60s}}};
  torch::manual_seed(5);
  TinyNet net(6, 5, 3);  // 53 parameters: the ranks' slices are uneven
  Optimizer adamw(net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1).amsgrad(true));
  auto [model, opt] = acc.prepare(net, adamw);
  regression_steps(acc, model, opt);
  save_tensor(job_dir() / (tag + "_rank" + std::to_string(acc.process_index()) + ".bin"), whole_parameters(acc, model));
}

template <class Backend, class Precision = accelerate::Fp32>
void train_both(const std::string& tag) {
  train_adamw<Backend, Precision, accelerate::FusedAdamW>(tag + "_fused");
  train_adamw<Backend, Precision, torch::optim::AdamW>(tag + "_torch");
}

ACCELERATE_WORKER(fused_adamw_on_slices) {
  train_both<accelerate::Gloo>("ddp");
  train_both<accelerate::Zero<accelerate::Gloo, 1>>("zero1");
  train_both<accelerate::Zero<accelerate::Gloo, 2>>("zero2");
  train_both<accelerate::Zero<accelerate::Gloo, 3>>("zero3");
  train_both<accelerate::Zero<accelerate::Gloo, 2>, accelerate::Fp16>("zero2_fp16");
  return 0;
}

TEST(FusedAdamWTwoRanks, StepsEveryZeroStagesSlicesAsTorchOptimAdamW) {
  auto job = run_job("fused_adamw_on_slices", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  const auto ddp = load_tensor(job.dir / "ddp_torch_rank0.bin");
  for (const std::string tag : {"ddp", "zero1", "zero2", "zero3", "zero2_fp16"})
    for (int r = 0; r < 2; ++r) {
      const auto fused = load_tensor(job.dir / (tag + "_fused_rank" + std::to_string(r) + ".bin"));
      const auto reference = load_tensor(job.dir / (tag + "_torch_rank" + std::to_string(r) + ".bin"));
      EXPECT_LE((fused - reference).abs().max().item<double>(), 1e-6) << tag << " rank " << r;
      if (tag != "zero2_fp16") {
        EXPECT_LE((fused - ddp).abs().max().item<double>(), 1e-6) << tag << " rank " << r;
      }
    }
}

// One window of kMicro token micro-batches per rank, SGD with lr 1: the parameters move by
// exactly the window's gradient. Saves them as <tag>_rank<r>.bin.
template <class Backend>
void token_window(const std::string& tag) {
  accelerate::Accelerator<Backend, accelerate::Fp32, accelerate::Accumulate<kMicro>> acc{
      {.process_group = {.timeout = 60s}}};
  auto head = token_head();
  torch::optim::SGD sgd(head->parameters(), 1.0);
  auto [model, opt] = acc.prepare(head, sgd);
  for (int m = 0; m < kMicro; ++m) {
    auto step = acc.accumulate(model);
    const TokenBatch batch = token_batch(m, acc.process_index());
    acc.backward(token_loss_sum(model(batch.x), batch), {.num_items = token_count(batch)});
    opt.step();
    opt.zero_grad();
  }
  save_tensor(job_dir() / (tag + "_rank" + std::to_string(acc.process_index()) + ".bin"), whole_parameters(acc, model));
}

ACCELERATE_WORKER(token_weighted_window) {
  token_window<accelerate::Gloo>("ddp");
  token_window<accelerate::Zero<accelerate::Gloo, 2>>("zero2");
  return 0;
}

TEST(TokenWeightingTwoRanks, TheWindowsGradientIsTheMeanOverEveryTokenOfEveryRank) {
  auto job = run_job("token_weighted_window", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  torch::nn::Linear head = token_head();
  std::vector<torch::Tensor> flat;
  for (const auto& p : head->parameters()) flat.push_back(p.detach().reshape(-1));
  const auto initial = torch::cat(flat);
  const auto token_mean = accelerate::testing::window_gradient(kMicro, 2, /*token_mean=*/true);
  const auto batch_mean = accelerate::testing::window_gradient(kMicro, 2, /*token_mean=*/false);
  ASSERT_GT((token_mean - batch_mean).abs().max().item<double>(), 1e-2) << "the two means must differ for this test";
  for (const std::string tag : {"ddp", "zero2"})
    for (int r = 0; r < 2; ++r) {
      const auto params = load_tensor(job.dir / (tag + "_rank" + std::to_string(r) + ".bin"));
      EXPECT_LE((initial - params - token_mean).abs().max().item<double>(), 1e-6) << tag << " rank " << r;
    }
}

// --- activation checkpointing ------------------------------------------------------------

struct ResidualBlockImpl : torch::nn::Module {
  ResidualBlockImpl()
      : fc(register_module("fc", torch::nn::Linear(6, 6))), dropout(register_module("dropout", torch::nn::Dropout(0.2))) {}
  at::Tensor forward(const at::Tensor& x) { return x + dropout(torch::gelu(fc(x))); }
  torch::nn::Linear fc;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(ResidualBlock);

// Each block checkpointed or not; the stage-3 runs list the blocks as units, so that
// activation_checkpoint gathers each for its forward and again for its recompute.
struct BlockStackImpl : torch::nn::Module {
  explicit BlockStackImpl(bool checkpointed) : checkpointed(checkpointed) {
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("block" + std::to_string(i), ResidualBlock()));
    head = register_module("head", torch::nn::Linear(6, 3));
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& block : blocks)
      x = checkpointed ? accelerate::activation_checkpoint(block, x) : accelerate::unit_forward(block, x);
    return head(x);
  }
  bool checkpointed;
  std::vector<ResidualBlock> blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(BlockStack);

// kSteps of SGD with momentum on a stack of dropout blocks, checkpointed or not; each rank
// draws its own dropout masks, the same in both runs. Saves <tag>_rank<r>.bin.
template <class Backend>
void train_blocks(bool checkpointed, const std::string& tag, std::vector<std::string> units = {}) {
  accelerate::Accelerator<Backend> acc{{.process_group = {.timeout = 60s}, .ddp = {.shard_units = units}}};
  torch::manual_seed(5);
  BlockStack net(checkpointed);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto [model, opt] = acc.prepare(net, sgd);
  torch::manual_seed(50 + acc.process_index());
  regression_steps(acc, model, opt);
  // The all-gathers of the steps (stage 3): a recompute gathers its unit again where the plain
  // backward does, and starts nothing more.
  const auto gathers = static_cast<double>(acc.stats().allgather.calls);
  save_tensor(job_dir() / (tag + "_rank" + std::to_string(acc.process_index()) + ".bin"),
              torch::cat({whole_parameters(acc, model), torch::tensor({gathers})}));
}

template <class Backend>
void train_blocks_both(const std::string& tag, const std::vector<std::string>& units = {}) {
  train_blocks<Backend>(true, tag + "_checkpointed", units);
  train_blocks<Backend>(false, tag + "_plain", units);
}

ACCELERATE_WORKER(checkpointed_blocks) {
  train_blocks_both<accelerate::Gloo>("ddp");
  train_blocks_both<accelerate::Zero<accelerate::Gloo, 1>>("zero1");
  train_blocks_both<accelerate::Zero<accelerate::Gloo, 2>>("zero2");
  return 0;
}

// Rank r's checkpointed run of `tag` ended with the plain run's parameters, bitwise, after
// `extra_gathers` more all-gathers than it.
void expect_checkpointed_as_plain(const std::filesystem::path& dir, const std::string& tag, int r, double extra_gathers) {
  const auto checkpointed = load_tensor(dir / (tag + "_checkpointed_rank" + std::to_string(r) + ".bin"));
  const auto plain = load_tensor(dir / (tag + "_plain_rank" + std::to_string(r) + ".bin"));
  const int64_t n = plain.numel() - 1;  // the parameters, then the all-gather count
  EXPECT_TRUE(torch::equal(checkpointed.narrow(0, 0, n), plain.narrow(0, 0, n)))
      << tag << " rank " << r << ": parameters differ by "
      << (checkpointed.narrow(0, 0, n) - plain.narrow(0, 0, n)).abs().max().item<double>();
  EXPECT_EQ(checkpointed[n].item<double>(), plain[n].item<double>() + extra_gathers) << tag << " rank " << r
                                                                                    << ": all-gathers";
}

TEST(ActivationCheckpointTwoRanks, TrainsDataParallelAndZeroOneAndTwoBitwiseAsWithoutIt) {
  auto job = run_job("checkpointed_blocks", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  for (const std::string tag : {"ddp", "zero1", "zero2"})
    for (int r = 0; r < 2; ++r) expect_checkpointed_as_plain(job.dir, tag, r, /*extra_gathers=*/0);
}

ACCELERATE_WORKER(checkpointed_blocks_zero3) {
  train_blocks_both<accelerate::Zero<accelerate::Gloo, 3>>("zero3");  // the whole model gathered
  train_blocks_both<accelerate::Zero<accelerate::Gloo, 3>>("zero3_units", {"block0", "block1", "block2"});
  return 0;
}

TEST(ActivationCheckpointTwoRanks, TrainsZeroThreeWithAndWithoutUnitsBitwiseAsWithoutIt) {
  auto job = run_job("checkpointed_blocks_zero3", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  // A unit's recompute gathers it once for the recompute and its backward, as the plain
  // backward's hook does: no all-gather more than without checkpointing.
  for (const std::string tag : {"zero3", "zero3_units"})
    for (int r = 0; r < 2; ++r) expect_checkpointed_as_plain(job.dir, tag, r, /*extra_gathers=*/0);
}

}  // namespace
