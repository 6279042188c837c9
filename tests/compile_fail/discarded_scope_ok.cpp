// Must compile without a warning: every scope is kept in a variable. Twin of discarded_scope_fail.cpp.
#include <accelerate/accelerator.hpp>
#include <accelerate/data/tensor_dataset.hpp>

#pragma GCC diagnostic error "-Wunused-result"
#pragma GCC diagnostic error "-Wunused-variable"

using Acc = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Bf16, accelerate::Accumulate<2>>;

void train(Acc& acc, torch::nn::Linear& net) {
  auto [model] = acc.prepare(net);
  auto step = acc.accumulate(model);
  auto silent = acc.no_sync(model);
  auto cast = acc.autocast();
  auto first = acc.main_process_first();
  accelerate::Accelerator<> plain;
  auto [plain_model] = plain.prepare(net);
  auto always = plain.accumulate(plain_model);
  auto joined = plain.join_uneven_inputs(plain_model);
}
