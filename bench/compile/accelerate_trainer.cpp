// The same training loop as plain_torch_trainer.cpp through the Accelerator (the umbrella
// header, a distributed backend, accumulation and clipping policies, save_state and
// save_model): what a user's trainer translation unit costs to compile.
#include <accelerate/accelerate.hpp>

#include <torch/torch.h>

#include <iostream>

int main() {
  using Acc = accelerate::Accelerator<accelerate::Gloo, accelerate::Fp32, accelerate::Accumulate<2>,
                                      accelerate::ClipNorm<>>;
  Acc acc{{.seed = 0}};
  torch::nn::Sequential net(torch::nn::Linear(784, 256), torch::nn::ReLU(), torch::nn::Linear(256, 10));
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::StepLR scheduler(optimizer, 10, 0.5);
  const auto x = torch::randn({512, 784});
  const auto y = torch::randint(0, 10, {512});
  auto [model, opt, loader, sched] =
      acc.prepare(net, optimizer, accelerate::DataLoader(accelerate::data::TensorDataset(x, y), {.batch_size = 64}),
                  scheduler);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (auto& [inputs, targets] : loader) {
      auto step = acc.accumulate(model);
      acc.backward(torch::nn::functional::cross_entropy(model(inputs), targets));
      opt.step();
      sched.step();
      opt.zero_grad();
    }
  }
  acc.save_state("accelerate_state");
  acc.save_model(model, "accelerate_model");
  std::cout << "done\n";
}
