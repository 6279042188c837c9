// The compile-cost baseline: a small training loop written with LibTorch alone (batches sliced
// by hand). Twin of accelerate_trainer.cpp (same model, optimizer, scheduler, clipping and
// data); bench/compile/measure.py compiles both and compares wall time and peak memory.
#include <torch/torch.h>

#include <iostream>

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(784, 256), torch::nn::ReLU(), torch::nn::Linear(256, 10));
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::StepLR scheduler(optimizer, 10, 0.5);
  const auto x = torch::randn({512, 784});
  const auto y = torch::randint(0, 10, {512});
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int64_t start = 0; start < x.size(0); start += 64) {
      const auto inputs = x.narrow(0, start, 64), targets = y.narrow(0, start, 64);
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(net->forward(inputs), targets);
      loss.backward();
      torch::nn::utils::clip_grad_norm_(net->parameters(), 1.0);
      optimizer.step();
    }
    scheduler.step();
  }
  torch::save(net, "plain_model.pt");
  std::cout << "done\n";
}
