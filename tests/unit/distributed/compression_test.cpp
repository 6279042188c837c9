// Tests of include/accelerate/distributed/compression.hpp on one process: what a bucket
// becomes on the wire and how the sum that comes back becomes the average. With one rank the
// "sum" is the tensor itself, so every step of the round trip can be checked by hand.
#include <accelerate/distributed/compression.hpp>

#include <gtest/gtest.h>

#include <torch/torch.h>

namespace {

using accelerate::GradientCompression;
using accelerate::PowerSgdOptions;
using accelerate::distributed::BucketCompressor;
using accelerate::distributed::orthonormalize_columns;

TEST(OrthonormalizeColumns, GivesOrthonormalColumnsSpanningTheSame) {
  auto a = torch::randn({16, 3}, torch::kDouble);
  const auto original = a.clone();
  orthonormalize_columns(a);
  EXPECT_TRUE(torch::allclose(a.t().mm(a), torch::eye(3, torch::kDouble), 1e-12, 1e-12));
  // Same span: projecting the original columns onto the new ones changes nothing.
  EXPECT_TRUE(torch::allclose(a.mm(a.t().mm(original)), original, 1e-10, 1e-10));
}

TEST(OrthonormalizeColumns, LeavesAZeroColumnZeroInsteadOfNaN) {
  auto a = torch::zeros({4, 2});
  orthonormalize_columns(a);
  EXPECT_TRUE(torch::equal(a, torch::zeros({4, 2})));
}

TEST(BucketCompressor, Bf16SendsHalfPrecisionPreDividedByTheWorldSize) {
  BucketCompressor compressor(GradientCompression::bf16, {}, {{0, {6}}});
  auto flat = torch::tensor({1.0f, -2.0f, 3.0f, 0.5f, 1e-3f, 7.0f});
  const auto wire = compressor.compress(flat, /*world_size=*/2);
  EXPECT_EQ(wire.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(wire.to(torch::kFloat), (flat / 2).to(torch::kBFloat16).to(torch::kFloat)));
  // The peer sent the same: the sum is 2 * wire, decompressed into the (now averaged) bucket.
  wire.mul_(2);
  const auto expected = wire.to(torch::kFloat);
  EXPECT_FALSE(compressor.decompress(flat, 2).defined());  // one sum only
  EXPECT_TRUE(torch::equal(flat, expected));
}

// A bucket holding a 6x4 weight of rank 1 and a bias: PowerSGD of rank 1 sends the bias as it
// is and the weight as two factors, and a rank-1 matrix comes back exactly.
TEST(BucketCompressor, PowerSgdRecoversARankOneMatrixAndSendsTheVectorAsItIs) {
  PowerSgdOptions options{.rank = 1, .min_compression_rate = 1.0};
  BucketCompressor compressor(GradientCompression::power_sgd, options, {{0, {6, 4}}, {24, {3}}});
  ASSERT_TRUE(compressor.two_rounds());
  const auto u = torch::randn({6, 1}), v = torch::randn({1, 4});
  auto flat = torch::cat({u.mm(v).reshape(-1), torch::tensor({1.0f, 2.0f, 3.0f})});
  const auto input = flat.clone();
  auto wire = compressor.compress(flat, 1);
  EXPECT_EQ(wire.numel(), 3 + 6);  // the bias, then P (6 x 1)
  auto q = compressor.decompress(flat, 1);
  ASSERT_TRUE(q.defined());
  EXPECT_EQ(q.numel(), 4);  // Q (4 x 1)
  EXPECT_TRUE(torch::equal(flat.narrow(0, 24, 3), input.narrow(0, 24, 3)));
  compressor.finish(flat, 1);
  EXPECT_TRUE(torch::allclose(flat, input, 1e-5, 1e-5)) << flat - input;
}

// Error feedback: what rank 1 misses of a full-rank matrix is added to the next gradient, so
// over two steps the sum of what was sent plus what is still owed is the sum of the inputs.
TEST(BucketCompressor, PowerSgdFeedsTheErrorIntoTheNextStep) {
  PowerSgdOptions options{.rank = 1, .min_compression_rate = 1.0};
  BucketCompressor compressor(GradientCompression::power_sgd, options, {{0, {5, 5}}});
  const auto g1 = torch::randn({25}), g2 = torch::randn({25});
  auto flat = g1.clone();
  compressor.compress(flat, 1);
  compressor.decompress(flat, 1);
  compressor.finish(flat, 1);
  const auto sent1 = flat.clone();
  EXPECT_GT((sent1 - g1).abs().max().item<double>(), 1e-3);  // a rank-1 approximation is not exact
  flat = g2.clone();
  auto wire = compressor.compress(flat, 1);
  // The input was corrected by the error of step 1 before compressing.
  EXPECT_TRUE(torch::allclose(flat, g2 + (g1 - sent1), 1e-5, 1e-5));
  compressor.decompress(flat, 1);
  compressor.finish(flat, 1);
  const auto sent2 = flat.clone();
  // A rank-1 result each time.
  const auto s = torch::linalg_svdvals(sent2.view({5, 5}));
  EXPECT_LT((s[1] / s[0]).item<double>(), 1e-5);
  // Without error feedback the second input is left as it was.
  BucketCompressor plain(GradientCompression::power_sgd, {.rank = 1, .error_feedback = false, .min_compression_rate = 1.0},
                         {{0, {5, 5}}});
  auto f = g1.clone();
  plain.compress(f, 1);
  plain.decompress(f, 1);
  plain.finish(f, 1);
  f = g2.clone();
  plain.compress(f, 1);
  EXPECT_TRUE(torch::equal(f, g2));
}

TEST(BucketCompressor, PowerSgdLeavesMatricesThatWouldNotShrinkUncompressed) {
  // 4x4 at rank 2: 16 values against 2 * (4 + 4) = 16, below the default rate of 2.
  BucketCompressor compressor(GradientCompression::power_sgd, {.rank = 2}, {{0, {4, 4}}});
  EXPECT_FALSE(compressor.two_rounds());
  auto flat = torch::randn({16});
  const auto input = flat.clone();
  auto wire = compressor.compress(flat, 2);
  EXPECT_TRUE(torch::equal(wire, input));
  wire.mul_(2);  // the peer sent the same
  EXPECT_FALSE(compressor.decompress(flat, 2).defined());
  EXPECT_TRUE(torch::allclose(flat, input));
}

// One PowerSGD step on one rank: compress, decompress, finish.
void power_sgd_step(BucketCompressor& compressor, at::Tensor& flat) {
  compressor.compress(flat, 1);
  compressor.decompress(flat, 1);
  compressor.finish(flat, 1);
}

// A compressor restored from another's state() compresses the next gradient exactly as the
// original does (warm-start Q, error feedback, generator), and a state of another shape is
// refused without changing anything.
TEST(BucketCompressor, PowerSgdStateRoundTripsAndIsCheckedFirst) {
  const PowerSgdOptions options{.rank = 2, .min_compression_rate = 1.0};
  const std::vector<accelerate::distributed::BucketEntry> entries{{0, {8, 6}}, {48, {5}}};
  BucketCompressor original(GradientCompression::power_sgd, options, entries);
  auto flat = torch::randn({53});
  power_sgd_step(original, flat);
  const auto saved = original.state();
  ASSERT_EQ(saved.size(), 3u) << "q, error and generator";

  BucketCompressor restored(GradientCompression::power_sgd, options, entries);
  restored.load_state(saved, flat.options(), /*keep=*/true);
  auto next = torch::randn({53});
  auto next_copy = next.clone();
  power_sgd_step(original, next);
  power_sgd_step(restored, next_copy);
  EXPECT_TRUE(torch::equal(next, next_copy));

  BucketCompressor other(GradientCompression::power_sgd, options, {{0, {6, 8}}, {48, {5}}, {53, {4, 4}}});
  auto wrong = saved;
  EXPECT_THROW(other.check_state(wrong), accelerate::Error);
  wrong["q"] = torch::zeros({3});
  EXPECT_THROW(restored.load_state(wrong, flat.options(), true), accelerate::Error);
  EXPECT_TRUE(torch::equal(restored.state().at("q"), original.state().at("q"))) << "unchanged by the refusal";
  BucketCompressor fp16(GradientCompression::fp16, {}, entries);
  EXPECT_TRUE(fp16.state().empty());
  EXPECT_THROW(fp16.check_state(saved), accelerate::Error);
}

}  // namespace
