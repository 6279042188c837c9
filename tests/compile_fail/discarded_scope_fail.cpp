// Must not compile: scopes discarded as statements would end at once. The warning is an error
// here only, so the shared precompiled header keeps its flags. Twin of discarded_scope_ok.cpp.
#include <accelerate/accelerator.hpp>

#pragma GCC diagnostic error "-Wunused-result"

using Acc = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Bf16, accelerate::Accumulate<2>>;

void train(Acc& acc, torch::nn::Linear& net) {
  auto [model] = acc.prepare(net);
  acc.accumulate(model);
  acc.no_sync(model);
  acc.autocast();
  acc.main_process_first();
  accelerate::Accelerator<> plain;
  auto [plain_model] = plain.prepare(net);
  plain.accumulate(plain_model);
  plain.join_uneven_inputs(plain_model);
}
