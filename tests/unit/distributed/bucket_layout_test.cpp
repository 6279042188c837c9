// Tests of include/accelerate/distributed/bucket_layout.hpp: bucket assignment, rebuilds and
// the slices of padded buckets, without processes or tensors.
#include <accelerate/distributed/bucket_layout.hpp>

#include <gtest/gtest.h>

#include <numeric>

namespace {

using accelerate::distributed::BucketedParameter;
using accelerate::distributed::BucketLayout;

using Lists = std::vector<std::vector<std::size_t>>;

Lists lists(const BucketLayout& layout) {
  Lists out;
  for (const auto& bucket : layout.buckets()) out.push_back(bucket.params);
  return out;
}

std::vector<BucketedParameter> floats(std::initializer_list<int64_t> numels) {
  std::vector<BucketedParameter> params;
  for (const int64_t n : numels) params.push_back({n, 4});
  return params;
}

TEST(BucketLayout, FillsInReverseRegistrationOrderAndClosesAtTheCaps) {
  // 16-byte first bucket, 40-byte others: parameter 3 (16 B) fills the first; 2 and 1 (24 B)
  // stay under 40, 0 brings the second to 44 and closes it.
  const BucketLayout layout(floats({5, 3, 3, 4}), 16, 40, 1);
  EXPECT_EQ(lists(layout), (Lists{{3}, {2, 1, 0}}));
  EXPECT_EQ(layout[1].offsets, (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(layout[1].length, 11);
  EXPECT_EQ(layout[1].padded, 11);
  EXPECT_EQ(layout.bucket_of(0), 1u);
  EXPECT_EQ(layout.position_of(0), 2u);
  EXPECT_EQ(layout.offset_of(0), 6);
  EXPECT_EQ(layout.launch_order(), (std::vector<std::size_t>{3, 2, 1, 0}));
  EXPECT_EQ(layout.initial_order(), layout.launch_order());
}

TEST(BucketLayout, KeepsKindsAndUnitsApart) {
  auto params = floats({2, 2, 2, 2});
  std::get<2>(params[1].kind) = 15;  // another dtype: a bucket of its own kind, opened beside
  params[3].unit = 1;                // stage 3: a unit's buckets are its own
  const BucketLayout layout(params, 1 << 20, 1 << 20, 1);
  EXPECT_EQ(lists(layout), (Lists{{3}, {2, 0}, {1}}));
}

TEST(BucketLayout, PadsToAMultipleAndCutsEqualSlicesInRankOrder) {
  const BucketLayout layout(floats({3, 4}), 1 << 20, 1 << 20, 3);  // one bucket: 4 then 3 elements
  ASSERT_EQ(layout.size(), 1u);
  EXPECT_EQ(layout[0].length, 7);
  EXPECT_EQ(layout[0].padded, 9);
  EXPECT_EQ(layout.slice_length(0, 3), 3);
  // Parameter 1 holds elements [0, 4) of the bucket, parameter 0 elements [4, 7).
  EXPECT_EQ(layout.held_by(1, 0, 3), (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(layout.held_by(1, 1, 3), (std::pair<int64_t, int64_t>{3, 4}));
  EXPECT_EQ(layout.held_by(1, 2, 3), (std::pair<int64_t, int64_t>{4, 4}));
  EXPECT_EQ(layout.held_by(0, 0, 3), (std::pair<int64_t, int64_t>{0, 0}));
  EXPECT_EQ(layout.held_by(0, 1, 3), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(layout.held_by(0, 2, 3), (std::pair<int64_t, int64_t>{2, 3}));  // the padding is nobody's
}

TEST(BucketLayout, RebuildsInAGivenOrder) {
  BucketLayout layout(floats({4, 4, 4, 4}), 16, 32, 1);
  EXPECT_EQ(lists(layout), (Lists{{3}, {2, 1}, {0}}));
  layout.lay_out({0, 1, 2, 3});
  EXPECT_EQ(lists(layout), (Lists{{0}, {1, 2}, {3}}));
  EXPECT_EQ(layout.bucket_of(2), 1u);
  EXPECT_EQ(layout.offset_of(2), 4);
}

TEST(BucketLayout, AcceptsOnlyOrdersNamingEveryParameterOnce) {
  const BucketLayout layout(floats({1, 1, 1}), 4, 4, 1);
  EXPECT_EQ(layout.order_from({2, 0, 1}), (std::vector<std::size_t>{2, 0, 1}));
  EXPECT_FALSE(layout.order_from({0, 1}).has_value());        // one missing
  EXPECT_FALSE(layout.order_from({0, 1, 1}).has_value());     // one twice
  EXPECT_FALSE(layout.order_from({0, 1, 3}).has_value());     // out of range
  EXPECT_FALSE(layout.order_from({0, -1, 2}).has_value());    // rank 0 saw no complete order
}

}  // namespace
