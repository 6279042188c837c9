// Tests of include/accelerate/data/batch.hpp: collating and nested containers of tensors.
#include <accelerate/data/batch.hpp>

#include <gtest/gtest.h>

#include <map>
#include <string>
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

}  // namespace
