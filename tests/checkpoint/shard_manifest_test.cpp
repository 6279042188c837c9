// Tests of checkpoint/shard_manifest.hpp without processes: sharded optimizer and model states
// cut for two ranks are re-cut for three (and for one), as load_state does when the number of
// processes changes, and every check names what does not match.
#include <accelerate/checkpoint/optimizer_state.hpp>
#include <accelerate/checkpoint/shard_manifest.hpp>

#include <gtest/gtest.h>

#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <vector>

#include "../support/errors.hpp"

namespace {

using accelerate::StateDict;
using accelerate::checkpoint::ShardRecord;
using accelerate::testing::error_of;

// A model of two parameters, w (4x3) and b (5), laid out flat as one bucket [w, b] of 17
// elements, padded to a multiple of the world size and cut into equal slices, as the sharded
// engines do. Every rank's optimizer steps only its slices with the slices of the same
// gradients; AdamW is element-wise, so each rank's state is the slice of a whole optimizer's.
struct Cut {
  int64_t parameter;  // 0: w, 1: b
  int64_t offset;
  int64_t numel;
};

const std::vector<int64_t> kWShape{4, 3};
const std::vector<int64_t> kBShape{5};

std::vector<Cut> cuts_of(int world, int rank) {
  const int64_t total = 17, per_rank = (total + world - 1) / world;
  const int64_t begin = per_rank * rank, end = std::min(total, begin + per_rank);
  std::vector<Cut> out;
  if (begin < 12) out.push_back({0, begin, std::min<int64_t>(end, 12) - begin});
  if (end > 12) out.push_back({1, std::max<int64_t>(begin, 12) - 12, end - std::max<int64_t>(begin, 12)});
  return out;
}

std::vector<ShardRecord> records_of(const std::vector<Cut>& cuts, bool optimizer) {
  std::vector<ShardRecord> out;
  for (std::size_t i = 0; i < cuts.size(); ++i) {
    ShardRecord record{.parameter = cuts[i].parameter == 0 ? "w" : "b",
                       .shape = cuts[i].parameter == 0 ? kWShape : kBShape,
                       .offset = cuts[i].offset,
                       .numel = cuts[i].numel};
    if (optimizer) {
      record.model = "model";
      record.index = static_cast<int64_t>(i);
    }
    out.push_back(record);
  }
  return out;
}

struct Rank {
  std::vector<at::Tensor> slices;
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

// Rank `rank` of `world`: its slices of `whole`, and an AdamW over them stepped `steps` times
// with the slices of the gradients of step k (deterministic in k).
Rank rank_of(int world, int rank, const std::vector<at::Tensor>& whole, int steps) {
  Rank out;
  for (const auto& cut : cuts_of(world, rank))
    out.slices.push_back(whole[cut.parameter].detach().reshape(-1).narrow(0, cut.offset, cut.numel).clone().requires_grad_());
  out.optimizer = std::make_unique<torch::optim::AdamW>(
      out.slices, torch::optim::AdamWOptions(0.01).weight_decay(0.1).amsgrad(true));
  const auto cuts = cuts_of(world, rank);
  for (int step = 0; step < steps; ++step) {
    for (std::size_t i = 0; i < cuts.size(); ++i) {
      const auto grad = at::sin(at::arange(17, at::kFloat) * (step + 1));
      const int64_t base = cuts[i].parameter == 0 ? 0 : 12;
      out.slices[i].mutable_grad() = grad.narrow(0, base + cuts[i].offset, cuts[i].numel).clone();
    }
    out.optimizer->step();
  }
  return out;
}

std::vector<at::Tensor> initial_parameters() {
  return {at::linspace(-1, 1, 12).reshape({4, 3}), at::linspace(0.5, 2, 5)};
}

StateDict saved_optimizer_state(int world, int rank, int steps) {
  auto r = rank_of(world, rank, initial_parameters(), steps);
  StateDict state = accelerate::checkpoint::optimizer_state_dict(*r.optimizer);
  state.values["shards"] = accelerate::checkpoint::shard_manifest(2, world, rank, records_of(cuts_of(world, rank), true));
  return state;
}

TEST(ShardManifest, OptimizerStateCutForTwoRanksLoadsIntoThreeAsIfTrainedThere) {
  const std::vector<StateDict> saved{saved_optimizer_state(2, 0, 3), saved_optimizer_state(2, 1, 3)};
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE(rank);
    auto fresh = rank_of(3, rank, initial_parameters(), 0);
    const auto mine = accelerate::checkpoint::shard_manifest(2, 3, rank, records_of(cuts_of(3, rank), true));
    const StateDict recut = accelerate::checkpoint::resharded_optimizer_state(mine, *fresh.optimizer, saved);
    EXPECT_EQ(recut.values.at("shards"), mine);
    accelerate::checkpoint::load_optimizer_state_dict(*fresh.optimizer, recut);
    // The same rank trained with three processes from the start.
    auto trained = rank_of(3, rank, initial_parameters(), 3);
    ASSERT_EQ(fresh.slices.size(), trained.slices.size());
    for (std::size_t i = 0; i < fresh.slices.size(); ++i) {
      auto& got = static_cast<torch::optim::AdamWParamState&>(*fresh.optimizer->state().at(fresh.slices[i].unsafeGetTensorImpl()));
      auto& want = static_cast<torch::optim::AdamWParamState&>(*trained.optimizer->state().at(trained.slices[i].unsafeGetTensorImpl()));
      EXPECT_EQ(got.step(), want.step());
      EXPECT_TRUE(at::equal(got.exp_avg(), want.exp_avg()));
      EXPECT_TRUE(at::equal(got.exp_avg_sq(), want.exp_avg_sq()));
      EXPECT_TRUE(at::equal(got.max_exp_avg_sq(), want.max_exp_avg_sq()));
    }
  }
}

TEST(ShardManifest, ModelSlicesAreReassembledAndBuffersComeFromRankZero) {
  const auto whole = initial_parameters();
  std::vector<StateDict> saved;
  for (int rank = 0; rank < 2; ++rank) {
    StateDict state;
    for (const auto& cut : cuts_of(2, rank))
      state.tensors[cut.parameter == 0 ? "w" : "b"] = whole[cut.parameter].reshape(-1).narrow(0, cut.offset, cut.numel).clone();
    state.tensors["running_mean"] = at::full({3}, 1.0 + rank);  // only rank 0's is read
    state.values["shards"] = accelerate::checkpoint::shard_manifest(3, 2, rank, records_of(cuts_of(2, rank), false));
    saved.push_back(std::move(state));
  }
  // Into one process: every parameter whole (flat), as whole_sharded_model_entry lists it.
  const auto one = accelerate::checkpoint::shard_manifest(
      3, 1, 0, {{.parameter = "w", .shape = kWShape, .numel = 12}, {.parameter = "b", .shape = kBShape, .numel = 5}});
  const StateDict recut = accelerate::checkpoint::resharded_model_state(one, saved);
  EXPECT_TRUE(at::equal(recut.tensors.at("w"), whole[0].reshape(-1)));
  EXPECT_TRUE(at::equal(recut.tensors.at("b"), whole[1]));
  EXPECT_TRUE(at::equal(recut.tensors.at("running_mean"), at::full({3}, 1.0)));
  // A slice no saved rank covers whole is an error naming the parameter and the gap.
  saved[1].tensors.erase("b");
  saved[1].values["shards"]["pieces"] = nlohmann::json::array({saved[1].values["shards"]["pieces"][0]});
  const auto message = error_of([&] { accelerate::checkpoint::resharded_model_state(one, saved); });
  EXPECT_NE(message.find("sharded model state: b: the saved slices cover 0 of the 5 elements [0, 5)"), std::string::npos)
      << message;
}

TEST(ShardManifest, WholeModelEntryOfOneProcessRoundTripsThroughThreeRanks) {
  torch::manual_seed(0);
  torch::nn::Linear saved_model(4, 3), loaded_model(4, 3);
  auto entry = accelerate::checkpoint::whole_sharded_model_entry(*saved_model, 3);
  const StateDict whole = entry.save();
  EXPECT_EQ(whole.values.at("shards").at("world_size"), 1);
  // Cut for three ranks (each its third of every parameter), then back into one process.
  std::vector<StateDict> three;
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<ShardRecord> records;
    for (const auto& piece : whole.values.at("shards").at("pieces")) {
      const int64_t numel = piece.at("numel").get<int64_t>(), per_rank = (numel + 2) / 3;
      const int64_t begin = std::min(numel, per_rank * rank), end = std::min(numel, begin + per_rank);
      if (begin < end)
        records.push_back({.parameter = piece.at("parameter").get<std::string>(),
                           .shape = piece.at("shape").get<std::vector<int64_t>>(), .offset = begin, .numel = end - begin});
    }
    const auto mine = accelerate::checkpoint::shard_manifest(3, 3, rank, records);
    three.push_back(accelerate::checkpoint::resharded_model_state(mine, {whole}));
  }
  auto into = accelerate::checkpoint::whole_sharded_model_entry(*loaded_model, 3);
  EXPECT_TRUE(into.laid_out_otherwise == nullptr || !into.laid_out_otherwise(whole));
  into.load(into.reshard(three));
  EXPECT_TRUE(at::equal(loaded_model->weight, saved_model->weight));
  EXPECT_TRUE(at::equal(loaded_model->bias, saved_model->bias));
}

TEST(ShardManifest, ChecksNameWhatDiffers) {
  const auto mine = accelerate::checkpoint::shard_manifest(2, 3, 1, records_of(cuts_of(3, 1), true));
  StateDict saved;
  auto message = error_of([&] { accelerate::checkpoint::check_optimizer_manifest(mine, saved); });
  EXPECT_NE(message.find("no \"shards\" manifest (saved by a data-parallel run?); it cannot be loaded into Zero stage 2"),
            std::string::npos) << message;
  saved.values["shards"] = accelerate::checkpoint::shard_manifest(2, 2, 1, records_of(cuts_of(2, 1), true));
  message = error_of([&] { accelerate::checkpoint::check_optimizer_manifest(mine, saved); });
  EXPECT_NE(message.find("saved with world_size 2, this run has 3"), std::string::npos) << message;
  EXPECT_FALSE(accelerate::checkpoint::cut_otherwise(mine, saved));  // another world size: resharded anyway

  // The same number of processes, cut otherwise (another bucket layout): re-cut, not refused.
  auto other = records_of(cuts_of(3, 1), true);
  other[0].offset += 1;
  saved.values["shards"] = accelerate::checkpoint::shard_manifest(2, 3, 1, other);
  EXPECT_TRUE(accelerate::checkpoint::cut_otherwise(mine, saved));
  message = error_of([&] { accelerate::checkpoint::check_optimizer_manifest(mine, saved); });
  EXPECT_NE(message.find("sharded optimizer state: slice 0 was saved as"), std::string::npos) << message;
  saved.values["shards"] = mine;
  EXPECT_FALSE(accelerate::checkpoint::cut_otherwise(mine, saved));
  EXPECT_NO_THROW(accelerate::checkpoint::check_optimizer_manifest(mine, saved));
}

TEST(ShardManifest, AssembledSliceCopiesTogetherOverlappingSlices) {
  using accelerate::checkpoint::SavedSlice;
  const auto flat = at::arange(10, at::kFloat);
  const std::vector<SavedSlice> slices{{0, 4, flat.narrow(0, 0, 4)}, {4, 3, flat.narrow(0, 4, 3)}, {7, 3, flat.narrow(0, 7, 3)}};
  EXPECT_TRUE(at::equal(accelerate::checkpoint::assembled_slice(2, 7, slices, "x"), flat.narrow(0, 2, 7)));
  const auto message = error_of([&] {
    accelerate::checkpoint::assembled_slice(2, 7, {slices[0], slices[2]}, "opt (exp_avg)");
  });
  EXPECT_NE(message.find("opt (exp_avg): the saved slices cover 4 of the 7 elements [2, 9)"), std::string::npos) << message;
}

}  // namespace
