// Tests of include/accelerate/data/ (sharding, batches, IDX) and prepared/dataloader.hpp.
#include <accelerate/accelerate.hpp>
#include <accelerate/data/idx.hpp>

#include <gtest/gtest.h>
#include <zlib.h>

#include <range/v3/view/enumerate.hpp>
#include <range/v3/view/take.hpp>
#include <set>

#include "../support/models.hpp"
#include "../support/temp_dir.hpp"

namespace {

using accelerate::data::ShardSampler;
using accelerate::data::ShardSpec;

std::vector<std::vector<int64_t>> epoch_batches(const ShardSampler& s, std::size_t epoch = 0) {
  const auto order = s.order(epoch);
  std::vector<std::vector<int64_t>> out;
  for (std::size_t k = 0; k < s.batches_per_rank(); ++k) out.push_back(s.batch(order, k));
  return out;
}

TEST(ShardSampler, OneProcessIsPlainBatching) {
  ShardSampler s({.dataset_size = 10, .batch_size = 4});
  EXPECT_EQ(epoch_batches(s), (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}}));
  EXPECT_EQ(s.remainder(), 0u);
  ShardSampler dropping({.dataset_size = 10, .batch_size = 4, .drop_last = true});
  EXPECT_EQ(dropping.batches_per_rank(), 2u);
}

TEST(ShardSampler, EvenBatchesWrapAroundToTheStartOfTheEpoch) {
  // 10 samples, batch 4, 2 ranks: global batches 0..3 dealt round-robin; the tail wraps.
  ShardSampler r0({.dataset_size = 10, .batch_size = 4, .world_size = 2, .rank = 0});
  ShardSampler r1({.dataset_size = 10, .batch_size = 4, .world_size = 2, .rank = 1});
  EXPECT_EQ(epoch_batches(r0), (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {8, 9, 0, 1}}));
  EXPECT_EQ(epoch_batches(r1), (std::vector<std::vector<int64_t>>{{4, 5, 6, 7}, {2, 3, 4, 5}}));
  EXPECT_EQ(r0.remainder(), 2u);  // of the last round's 8 samples, 2 are real
}

TEST(ShardSampler, ShardsAreDisjointAndCoverTheDataset) {
  for (std::size_t world : {2u, 3u}) {
    std::multiset<int64_t> seen;
    for (std::size_t rank = 0; rank < world; ++rank) {
      ShardSampler s({.dataset_size = 96, .batch_size = 8, .world_size = world, .rank = rank,
                      .shuffle = true, .seed = 5});
      for (const auto& b : epoch_batches(s, 3)) seen.insert(b.begin(), b.end());
    }
    EXPECT_EQ(seen.size(), 96u);
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 96u) << "world " << world;
  }
}

TEST(ShardSampler, UnevenAndDropLastModes) {
  ShardSpec spec{.dataset_size = 10, .batch_size = 4, .world_size = 2, .even_batches = false};
  spec.rank = 0;
  EXPECT_EQ(epoch_batches(ShardSampler(spec)), (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {8, 9}}));
  spec.rank = 1;
  EXPECT_EQ(epoch_batches(ShardSampler(spec)), (std::vector<std::vector<int64_t>>{{4, 5, 6, 7}}));
  ShardSampler dropping({.dataset_size = 10, .batch_size = 4, .world_size = 2, .drop_last = true});
  EXPECT_EQ(dropping.batches_per_rank(), 1u);
}

TEST(ShardSampler, ShuffleDependsOnSeedAndEpochOnly) {
  ShardSampler a({.dataset_size = 50, .batch_size = 5, .shuffle = true, .seed = 1});
  ShardSampler b({.dataset_size = 50, .batch_size = 5, .shuffle = true, .seed = 1});
  EXPECT_EQ(a.order(2), b.order(2));
  EXPECT_NE(a.order(2), a.order(3));
  ShardSampler c({.dataset_size = 50, .batch_size = 5, .shuffle = true, .seed = 2});
  EXPECT_NE(a.order(2), c.order(2));
}

TEST(Batch, MapCollateAndMoveNestedStructures) {
  using Example = torch::data::Example<torch::Tensor, torch::Tensor>;
  std::vector<Example> samples{{torch::ones({3}), torch::tensor(1)}, {torch::zeros({3}), torch::tensor(2)}};
  auto batch = accelerate::data::collate(samples);
  EXPECT_EQ(batch.data.sizes(), torch::IntArrayRef({2, 3}));
  EXPECT_TRUE(torch::equal(batch.target, torch::tensor({1, 2})));

  std::map<std::string, std::vector<torch::Tensor>> nested{{"a", {torch::ones({2}), torch::ones({1})}}};
  auto doubled = accelerate::data::map_tensors(nested, [](const torch::Tensor& t) { return t * 2; });
  EXPECT_TRUE(torch::equal(doubled["a"][0], torch::full({2}, 2.0)));
  int count = 0;
  accelerate::data::for_each_tensor(doubled, [&](const torch::Tensor&) { ++count; });
  EXPECT_EQ(count, 2);
  EXPECT_EQ(accelerate::data::batch_rows(batch), 2);
}

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

TEST(PreparedDataLoader, StateFromAnotherShardingIsAnError) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto [loader] = acc.prepare(accelerate::DataLoader(accelerate::testing::regression_data(40), {.batch_size = 4}));
  auto state = loader.state_dict();
  state.values["world_size"] = 2;
  try {
    loader.load_state_dict(state);
    FAIL() << "expected an error";
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("saved with 2 processes, this run has 1"), std::string::npos) << e.what();
  }
}

void write_gz(const std::filesystem::path& path, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

TEST(Idx, ReadsImagesAndReportsTruncation) {
  accelerate::testing::TempDir dir;
  std::vector<unsigned char> idx{0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3};
  for (int i = 0; i < 12; ++i) idx.push_back(static_cast<unsigned char>(i));
  write_gz(dir / "ok.gz", idx);
  auto t = accelerate::data::read_idx(dir / "ok.gz");
  EXPECT_EQ(t.sizes(), torch::IntArrayRef({2, 2, 3}));
  EXPECT_EQ(t[1][1][2].item<int>(), 11);

  idx.resize(idx.size() - 3);
  write_gz(dir / "short.gz", idx);
  try {
    accelerate::data::read_idx(dir / "short.gz");
    FAIL();
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("short.gz: truncated while reading the data"), std::string::npos) << e.what();
  }
}

TEST(Idx, MissingFashionMnistNamesTheDebianPackage) {
  try {
    accelerate::data::load_fashion_mnist("/nonexistent", true);
    FAIL();
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("dataset-fashion-mnist"), std::string::npos) << e.what();
  }
}

}  // namespace
