// Small seeded models and datasets shared by the tests.
#pragma once

#include <cstdint>

#include <torch/torch.h>

#include <accelerate/data/tensor_dataset.hpp>

namespace accelerate::testing {

/// Two linear layers: enough to exercise several parameters and buckets, quick to train.
struct TinyNetImpl : torch::nn::Module {
  explicit TinyNetImpl(int64_t in = 8, int64_t hidden = 16, int64_t out = 4)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, out))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(TinyNet);

/// A regression dataset with a fixed seed: inputs [n, in], targets [n, out].
inline data::TensorDataset regression_data(int64_t n, int64_t in = 8, int64_t out = 4,
                                           uint64_t seed = 1234) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor x = at::randn({n, in}, gen);
  at::Tensor w = at::randn({in, out}, gen);
  at::Tensor y = x.matmul(w) + 0.1 * at::randn({n, out}, gen);
  return {x, y};
}

/// A classification dataset with a fixed seed: inputs [n, in], labels in [0, classes).
inline data::TensorDataset classification_data(int64_t n, int64_t in = 8, int64_t classes = 4,
                                               uint64_t seed = 99) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor x = at::randn({n, in}, gen);
  at::Tensor y = at::randint(0, classes, {n}, gen);
  return {x, y};
}

/// Every parameter of a module flattened into one tensor (to compare models).
inline torch::Tensor flat_parameters(const torch::nn::Module& module) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : module.parameters()) parts.push_back(p.detach().reshape(-1).cpu());
  return torch::cat(parts);
}

}  // namespace accelerate::testing
