// Compiles: prepare() of a module. Twin of unpreparable_fail.cpp.
#include <accelerate/accelerator.hpp>
#include <torch/nn/modules/linear.h>
void f(accelerate::Accelerator<>& acc, torch::nn::Linear& value) { auto [x] = acc.prepare(value); }
