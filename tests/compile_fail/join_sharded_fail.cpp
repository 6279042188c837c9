// Must not compile: join_uneven_inputs under a sharded Backend, whose optimizer step and
// clipping are collectives a rank that ran out of batches cannot match. Twin of
// join_sharded_ok.cpp.
#include <accelerate/accelerator.hpp>
#include <accelerate/distributed/sharded.hpp>

using Acc = accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 2>>;

void train(Acc& acc, torch::nn::Linear& net) {
  auto [model] = acc.prepare(net);
  auto join = acc.join_uneven_inputs(model);
}
