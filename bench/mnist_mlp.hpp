// The MNIST-sized MLP of the benchmarks (784-256-128-10, 235k parameters): big enough that a
// step is real work, small enough that bookkeeping and reading data still show.
#pragma once

#include <torch/torch.h>

namespace accelerate::bench {

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 256))),
        fc2(register_module("fc2", torch::nn::Linear(256, 128))),
        fc3(register_module("fc3", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

}  // namespace accelerate::bench
