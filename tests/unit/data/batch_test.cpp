// Tests of include/accelerate/data/batch.hpp and batch_layout.hpp: collating, nested
// containers of tensors, and packing them for another process.
#include <accelerate/data/batch.hpp>
#include <accelerate/data/batch_layout.hpp>

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <torch/data/example.h>

namespace {

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

TEST(PackBatch, NestedBatchesOfEveryDtypeComeBackEqual) {
  using Batch = std::tuple<at::Tensor, std::vector<at::Tensor>, std::map<std::string, at::Tensor>, int64_t, std::string>;
  const Batch batch{at::arange(6, at::kFloat).reshape({2, 3}),
                    {at::tensor({1, 0, 1}).to(at::kBool), at::tensor(7, at::kLong), at::empty({0, 4}), at::Tensor()},
                    {{"ids", at::arange(5, at::kLong).flip(0)}, {"half", at::ones({2}, at::kBFloat16)}},
                    42,
                    "shard-0007"};
  auto [layout, bytes] = accelerate::data::pack_batch(batch, at::kCPU);
  EXPECT_EQ(bytes.scalar_type(), at::kByte);
  EXPECT_EQ(bytes.numel(), 24 + 3 + 8 + 40 + 4);
  EXPECT_EQ(accelerate::data::packed_bytes(layout), bytes.numel());
  const auto back = accelerate::data::unpack_batch<Batch>(layout, bytes);
  EXPECT_TRUE(torch::equal(std::get<0>(back), std::get<0>(batch)));
  ASSERT_EQ(std::get<1>(back).size(), 4u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(std::get<1>(back)[i].scalar_type(), std::get<1>(batch)[i].scalar_type());
    EXPECT_EQ(std::get<1>(back)[i].sizes(), std::get<1>(batch)[i].sizes());
    EXPECT_TRUE(torch::equal(std::get<1>(back)[i], std::get<1>(batch)[i]));
  }
  EXPECT_FALSE(std::get<1>(back)[3].defined());
  EXPECT_TRUE(torch::equal(std::get<2>(back).at("ids"), std::get<2>(batch).at("ids")));
  EXPECT_TRUE(torch::equal(std::get<2>(back).at("half"), std::get<2>(batch).at("half")));
  EXPECT_EQ(std::get<3>(back), 42);
  EXPECT_EQ(std::get<4>(back), "shard-0007");

  // A layout part: what rank r of a dispatched round reads.
  const std::vector<torch::data::Example<>> round{{at::ones({2, 2}), at::zeros({2})}, {at::full({3, 2}, 2.0), at::ones({3})}};
  auto [round_layout, round_bytes] = accelerate::data::pack_batch(round, at::kCPU);
  const auto first = accelerate::data::packed_bytes(round_layout[0]);
  EXPECT_EQ(first, 4 * 6);
  const auto second = accelerate::data::unpack_batch<torch::data::Example<>>(
      round_layout[1], round_bytes.narrow(0, first, round_bytes.numel() - first));
  EXPECT_TRUE(torch::equal(second.data, round[1].data));
  EXPECT_TRUE(torch::equal(second.target, round[1].target));
}

TEST(PackBatch, ALayoutOfAnotherTypeOrTooFewBytesIsAnError) {
  auto [layout, bytes] = accelerate::data::pack_batch(std::make_tuple(at::ones({2}), at::ones({3})), at::kCPU);
  using Named = std::map<std::string, at::Tensor>;
  EXPECT_THROW(accelerate::data::unpack_batch<Named>(layout, bytes), accelerate::Error);
  EXPECT_THROW((accelerate::data::unpack_batch<std::tuple<at::Tensor, at::Tensor>>(layout, bytes.narrow(0, 0, 8))),
               accelerate::Error);
  EXPECT_THROW((accelerate::data::unpack_batch<std::tuple<at::Tensor, at::Tensor>>(layout, at::cat({bytes, bytes}))),
               accelerate::Error);
}

}  // namespace
