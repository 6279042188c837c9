// bench_activation_checkpoint: the memory and time of one training step of an L-block
// transformer-like MLP stack (each block: Linear d -> 4d, GELU, Linear 4d -> d, residual; a
// batch of 16 x 128 positions, d = 256), with every block run through
// accelerate::activation_checkpoint or not. One process per measurement (peak memory is the
// process's peak resident set): bench/activation_checkpoint.sh alternates the variants.
//
//   bench_activation_checkpoint --variant plain|checkpointed [--blocks L] [--steps N] [--round R]
// Prints one JSON line: the process's peak resident memory above its resident memory after a
// first, untimed step (model, gradients, momentum, batch, and whatever heap the allocator
// kept), and the median step time.
#include <accelerate/accelerate.hpp>

#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

constexpr int64_t kWidth = 256, kBatch = 16, kPositions = 128;

struct MlpBlockImpl : torch::nn::Module {
  MlpBlockImpl()
      : up(register_module("up", torch::nn::Linear(kWidth, 4 * kWidth))),
        down(register_module("down", torch::nn::Linear(4 * kWidth, kWidth))) {}
  at::Tensor forward(const at::Tensor& x) { return x + down(torch::gelu(up(x))); }
  torch::nn::Linear up, down;
};
TORCH_MODULE(MlpBlock);

int64_t resident_kb() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

int64_t peak_resident_kb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

}  // namespace

int main(int argc, char** argv) {
  std::string variant = "plain";
  int blocks = 8, steps = 5, round = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--variant") variant = argv[i + 1];
    else if (flag == "--blocks") blocks = std::stoi(argv[i + 1]);
    else if (flag == "--steps") steps = std::stoi(argv[i + 1]);
    else if (flag == "--round") round = std::stoi(argv[i + 1]);
  }
  const bool checkpointed = variant == "checkpointed";
  torch::manual_seed(0);
  std::vector<MlpBlock> stack;
  std::vector<at::Tensor> params;
  for (int b = 0; b < blocks; ++b) {
    stack.emplace_back();
    for (const auto& p : stack.back()->parameters()) params.push_back(p);
  }
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(1e-3).momentum(0.9));
  const at::Tensor x = torch::randn({kBatch, kPositions, kWidth});
  const at::Tensor target = torch::randn({kBatch, kPositions, kWidth});
  const auto step = [&] {
    at::Tensor h = x;
    for (auto& block : stack) h = checkpointed ? accelerate::activation_checkpoint(block, h) : block(h);
    torch::mse_loss(h, target).backward();
    sgd.step();
  };
  // Gradients and momentum exist after a first step; zero_grad keeps them (set_to_none off),
  // so what grows above `base` in the timed steps is activations and temporaries.
  step();
  sgd.zero_grad(false);
  const int64_t base = resident_kb();
  std::vector<double> ms;
  for (int s = 0; s < steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    sgd.zero_grad(false);
  }
  std::sort(ms.begin(), ms.end());
  const double block_input_mb = 4.0 * kBatch * kPositions * kWidth / 1e6;
  std::cout << R"({"variant": ")" << variant << R"(", "round": )" << round << R"(, "blocks": )" << blocks
            << R"(, "peak_above_base_mb": )" << (peak_resident_kb() - base) / 1024.0 << R"(, "block_input_mb": )"
            << block_input_mb << R"(, "ms_per_step": )" << ms[ms.size() / 2] << "}\n";
  return 0;
}
