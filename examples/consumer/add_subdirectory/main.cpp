// A trainer built with accelerate-cpp as a subproject: the umbrella header, two processes.
#include <accelerate/accelerate.hpp>

#include <torch/nn/modules/linear.h>

#include <iostream>

int main(int argc, char** argv) {
  return accelerate::launch(argc, argv, [](int, char**) {
    accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = std::chrono::seconds(60)}}};
    torch::nn::Linear net(4, 1);
    auto [model] = acc.prepare(net);
    const auto total = acc.reduce(torch::ones({1}), accelerate::Reduction::sum).item<double>();
    acc.print("consumer: ranks", total);
    return total == acc.num_processes() ? 0 : 1;
  });
}
