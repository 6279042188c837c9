// A trainer outside the project: includes only the policy core and trains a few steps.
#include <accelerate/accelerator.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <iostream>

int main() {
  accelerate::Accelerator<> acc{{.cpu = true, .seed = 0}};
  torch::nn::Linear net(4, 1);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, sgd);
  const auto x = torch::randn({32, 4});
  const auto y = x.sum(1, true);
  double first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    opt.zero_grad();
    auto loss = torch::mse_loss(model(x), y);
    acc.backward(loss);
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  std::cout << "consumer: loss " << first << " -> " << last << std::endl;
  return last < first ? 0 : 1;
}
