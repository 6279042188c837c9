// Must not compile: prepare() of something that is no model, optimizer, scheduler or data.
// Twin of unpreparable_ok.cpp.
#include <accelerate/accelerator.hpp>
#include <torch/nn/modules/linear.h>
void f(accelerate::Accelerator<>& acc, torch::nn::LinearOptions& value) { auto [x] = acc.prepare(value); }
