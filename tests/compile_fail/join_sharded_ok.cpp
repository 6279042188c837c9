// Must compile: join_uneven_inputs under replicated data parallel. Twin of
// join_sharded_fail.cpp.
#include <accelerate/accelerator.hpp>
#include <accelerate/distributed/process_group.hpp>

using Acc = accelerate::Accelerator<accelerate::Gloo>;

void train(Acc& acc, torch::nn::Linear& net) {
  auto [model] = acc.prepare(net);
  auto join = acc.join_uneven_inputs(model);
}
