// The benchmarks' ~100 MB model: six 2048x2048 linear layers (25M parameters; with Adam's or
// AdamW's two moments, ~300 MB of training state).
#pragma once

#include <string>
#include <vector>

#include <torch/torch.h>

namespace accelerate::bench {

struct LargeImpl : torch::nn::Module {
  LargeImpl() {
    for (int i = 0; i < 6; ++i) layers.push_back(register_module("layer" + std::to_string(i), torch::nn::Linear(2048, 2048)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = torch::relu(l(x));
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};
TORCH_MODULE(Large);

}  // namespace accelerate::bench
