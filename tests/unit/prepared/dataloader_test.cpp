// Tests of include/accelerate/prepared/dataloader.hpp: what prepare() makes of datasets and
// ranges, epochs, and the saved position.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <range/v3/view/enumerate.hpp>
#include <range/v3/view/take.hpp>

#include "../../support/models.hpp"

namespace {

TEST(PreparedDataLoader, DatasetWithoutGetBatchIsCollated) {
  // A LibTorch-style map dataset with only get(): samples are stacked.
  struct Squares : torch::data::datasets::Dataset<Squares> {
    torch::data::Example<> get(size_t i) override {
      return {torch::full({2}, double(i * i)), torch::tensor(int64_t(i))};
    }
    torch::optional<size_t> size() const override { return 5; }
  };
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto [loader] = acc.prepare(accelerate::DataLoader(Squares{}, {.batch_size = 2}));
  std::vector<int64_t> targets;
  for (auto& [x, y] : loader) {
    EXPECT_EQ(x.size(1), 2);
    for (int64_t i = 0; i < y.size(0); ++i) targets.push_back(y[i].item<int64_t>());
  }
  EXPECT_EQ(targets, (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(PreparedDataLoader, WorksWithRangeV3Views) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto [loader] = acc.prepare(accelerate::DataLoader(accelerate::testing::regression_data(40), {.batch_size = 4}));
  int seen = 0;
  for (auto&& [index, batch] : loader | ranges::views::enumerate | ranges::views::take(3)) {
    EXPECT_EQ(static_cast<int>(index), seen);
    EXPECT_EQ(batch.data.size(0), 4);
    ++seen;
  }
  EXPECT_EQ(seen, 3);
}

TEST(PreparedDataLoader, EpochsAdvanceAndShuffleDiffers) {
  accelerate::Accelerator<> acc{{.cpu = true, .seed = 11}};
  auto [loader] = acc.prepare(accelerate::DataLoader(accelerate::testing::regression_data(12), {.batch_size = 12, .shuffle = true}));
  std::vector<torch::Tensor> firsts;
  for (int epoch = 0; epoch < 2; ++epoch) {
    EXPECT_EQ(loader.epoch(), static_cast<std::size_t>(epoch));
    for (auto& [x, y] : loader) firsts.push_back(x.clone());
  }
  EXPECT_EQ(loader.epoch(), 2u);
  ASSERT_EQ(firsts.size(), 2u);
  EXPECT_FALSE(torch::equal(firsts[0], firsts[1]));
  loader.set_epoch(0);
  for (auto& [x, y] : loader) EXPECT_TRUE(torch::equal(x, firsts[0]));
}

TEST(PreparedDataLoader, StateResumesAtTheNextBatch) {
  auto data = accelerate::testing::regression_data(40);
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto [loader] = acc.prepare(accelerate::DataLoader(data, {.batch_size = 4, .shuffle = true, .seed = 3}));
  std::vector<torch::Tensor> straight;
  for (auto& [x, y] : loader) straight.push_back(x.clone());

  // Stop after 4 batches of epoch 0, save, and continue in a new loader.
  auto [first] = acc.prepare(accelerate::DataLoader(data, {.batch_size = 4, .shuffle = true, .seed = 3}));
  accelerate::StateDict saved;
  int k = 0;
  for ([[maybe_unused]] auto& batch : first) {
    if (++k == 4) {
      saved = first.state_dict();
      break;
    }
  }
  EXPECT_EQ(saved.value<std::size_t>("batches_consumed"), 4u);
  auto [second] = acc.prepare(accelerate::DataLoader(data, {.batch_size = 4, .shuffle = true, .seed = 99}));
  second.load_state_dict(saved);  // also restores the shuffle seed
  std::size_t index = 4;
  for (auto& [x, y] : second) EXPECT_TRUE(torch::equal(x, straight[index++]));
  EXPECT_EQ(index, straight.size());

  auto [skipping] = acc.prepare(accelerate::DataLoader(data, {.batch_size = 4, .shuffle = true, .seed = 3}));
  index = 7;
  for (auto& [x, y] : accelerate::skip_first_batches(skipping, 7)) EXPECT_TRUE(torch::equal(x, straight[index++]));
  EXPECT_EQ(index, straight.size());
}

TEST(PreparedDataLoader, StateOfAnotherWorldSizeResumesAfterTheSamplesAllRanksConsumed) {
  auto data = accelerate::testing::regression_data(40);
  accelerate::Accelerator<> acc{{.cpu = true}};
  const accelerate::DataLoaderOptions options{.batch_size = 4, .shuffle = true, .seed = 3};
  auto [reference] = acc.prepare(accelerate::DataLoader(data, options));
  std::vector<std::vector<torch::Tensor>> epochs(2);  // one process's batches: order positions 4k..4k+3
  for (auto& epoch : epochs)
    for (auto& [x, y] : reference) epoch.push_back(x.clone());

  // 2 processes consumed 3 batches each: positions 0..23 of epoch 0's order.
  for (const bool recorded : {true, false}) {  // states written before samples_consumed existed lack it
    auto [loader] = acc.prepare(accelerate::DataLoader(data, options));
    auto state = loader.state_dict();
    state.values["world_size"] = 2;
    state.values["batches_consumed"] = 3;
    if (recorded) state.values["samples_consumed"] = 24;
    else state.values.erase("samples_consumed");
    loader.load_state_dict(state);
    EXPECT_EQ(loader.size(), 4u) << "the rest of the epoch: 16 samples";
    std::size_t k = 6;
    for (auto& [x, y] : loader) EXPECT_TRUE(torch::equal(x, epochs[0][k++])) << "batch " << k;
    EXPECT_EQ(k, epochs[0].size());
    EXPECT_EQ(loader.size(), 10u) << "later epochs are whole";
    k = 0;
    for (auto& [x, y] : loader) EXPECT_TRUE(torch::equal(x, epochs[1][k++]));
    EXPECT_EQ(k, epochs[1].size());
  }
}

TEST(PreparedDataLoader, StateFromAnotherBatchingIsAnError) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto [loader] = acc.prepare(accelerate::DataLoader(accelerate::testing::regression_data(40), {.batch_size = 4}));
  auto state = loader.state_dict();
  state.values["batch_size"] = 8;
  state.values["batches_consumed"] = 2;
  try {
    loader.load_state_dict(state);
    FAIL() << "expected an error";
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("in batches of 8, this loader has 40 samples in batches of 4"),
              std::string::npos) << e.what();
  }
  EXPECT_EQ(loader.batches_consumed(), 0u) << "a refused state changes nothing";
}

}  // namespace
