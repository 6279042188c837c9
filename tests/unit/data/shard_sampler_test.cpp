// Tests of include/accelerate/data/shard_sampler.hpp: per-rank shards, even batches, shuffling.
#include <accelerate/data/shard_sampler.hpp>

#include <gtest/gtest.h>

#include <set>

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

TEST(ShardSampler, EpochStartDealsOnlyTheRestOfTheEpoch) {
  // 3 positions of a 10-sample epoch were consumed elsewhere; 2 ranks deal positions 3..9,
  // the tail wrapping around to position 3.
  std::vector<std::vector<std::vector<int64_t>>> ranks;
  for (std::size_t rank = 0; rank < 2; ++rank) {
    ShardSampler s({.dataset_size = 10, .batch_size = 2, .world_size = 2, .rank = rank});
    s.set_epoch_start(3);
    EXPECT_EQ(s.samples(), 7u);
    EXPECT_EQ(s.remainder(), 3u);
    ranks.push_back(epoch_batches(s));
  }
  EXPECT_EQ(ranks[0], (std::vector<std::vector<int64_t>>{{3, 4}, {7, 8}}));
  EXPECT_EQ(ranks[1], (std::vector<std::vector<int64_t>>{{5, 6}, {9, 3}}));
  ShardSampler one({.dataset_size = 10, .batch_size = 4, .shuffle = true, .seed = 2});
  one.set_epoch_start(6);
  const auto order = one.order(0);
  EXPECT_EQ(epoch_batches(one), (std::vector<std::vector<int64_t>>{{order[6], order[7], order[8], order[9]}}));
  one.set_epoch_start(99);
  EXPECT_EQ(one.batches_per_rank(), 0u) << "past the end: nothing left this epoch";
}

TEST(ShardSampler, ShuffleDependsOnSeedAndEpochOnly) {
  ShardSampler a({.dataset_size = 50, .batch_size = 5, .shuffle = true, .seed = 1});
  ShardSampler b({.dataset_size = 50, .batch_size = 5, .shuffle = true, .seed = 1});
  EXPECT_EQ(a.order(2), b.order(2));
  EXPECT_NE(a.order(2), a.order(3));
  ShardSampler c({.dataset_size = 50, .batch_size = 5, .shuffle = true, .seed = 2});
  EXPECT_NE(a.order(2), c.order(2));
}

TEST(LoaderShardSpec, SplitBatchesDivideTheGlobalBatchAndASeedIsDrawnOnlyToShuffle) {
  using accelerate::data::loader_shard_spec;
  int draws = 0;
  const auto draw = [&] {
    ++draws;
    return std::uint64_t{42};
  };
  const ShardSpec plain = loader_shard_spec({.batch_size = 8}, 100, 4, 3, false, true, draw);
  EXPECT_EQ(plain.batch_size, 8u);
  EXPECT_EQ(plain.rank, 3u);
  EXPECT_EQ(plain.seed, 0u);
  EXPECT_EQ(draws, 0) << "an unshuffled loader leaves the global generator alone";
  const ShardSpec split = loader_shard_spec({.batch_size = 8, .shuffle = true}, 100, 4, 1, true, false, draw);
  EXPECT_EQ(split.batch_size, 2u);
  EXPECT_TRUE(split.split_batches);
  EXPECT_FALSE(split.even_batches);
  EXPECT_EQ(split.seed, 42u);
  EXPECT_EQ(draws, 1);
  const ShardSpec seeded = loader_shard_spec({.batch_size = 8, .shuffle = true, .seed = 7}, 100, 4, 1, false, true, draw);
  EXPECT_EQ(seeded.seed, 7u);
  EXPECT_EQ(draws, 1) << "the loader's own seed needs no draw";
  try {
    (void)loader_shard_spec({.batch_size = 6}, 100, 4, 0, true, true, draw);
    ADD_FAILURE() << "6 does not divide among 4 processes";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("must divide between the 4 processes"), std::string::npos) << e.what();
  }
}

}  // namespace
