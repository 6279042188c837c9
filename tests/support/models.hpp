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

/// Records the dtype of its first Linear's output, inside the model (autocast tests).
struct ProbeImpl : torch::nn::Module {
  ProbeImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 16))), fc2(register_module("fc2", torch::nn::Linear(16, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = fc1(x);
    inner = h.scalar_type();
    return fc2(torch::relu(h));
  }
  torch::nn::Linear fc1, fc2;
  torch::ScalarType inner = torch::kFloat;
};
TORCH_MODULE(Probe);

/// One large layer, small ones and batch norm buffers (sharding and interoperability tests).
/// Python's twin is Wide in tests/checkpoint/interop.py.
struct WideImpl : torch::nn::Module {
  WideImpl()
      : big(register_module("big", torch::nn::Linear(64, 64))),  // 16 KiB weight
        small1(register_module("small1", torch::nn::Linear(8, 8))),
        small2(register_module("small2", torch::nn::Linear(8, 8))),
        norm(register_module("norm", torch::nn::BatchNorm1d(8))) {}
  torch::Tensor forward(const torch::Tensor& x) { return norm(small2(small1(big(x).narrow(1, 0, 8)))); }
  torch::nn::Linear big, small1, small2;
  torch::nn::BatchNorm1d norm;
};
TORCH_MODULE(Wide);

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

/// Every parameter's .grad flattened into one tensor, in parameters() order (each must be
/// defined).
inline torch::Tensor flat_gradients(const torch::nn::Module& module) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : module.parameters()) parts.push_back(p.grad().reshape(-1));
  return torch::cat(parts);
}

/// Bytes of a module's parameters (what one copy of its gradients takes).
inline std::int64_t parameter_bytes(const torch::nn::Module& module) {
  std::int64_t total = 0;
  for (const auto& p : module.parameters()) total += p.numel() * static_cast<std::int64_t>(p.element_size());
  return total;
}

/// Every parameter of a module flattened into one tensor (to compare models).
inline torch::Tensor flat_parameters(const torch::nn::Module& module) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : module.parameters()) parts.push_back(p.detach().reshape(-1).cpu());
  return torch::cat(parts);
}

}  // namespace accelerate::testing
