// Bodies of context.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/step/context.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE CoreState::CoreState(const AcceleratorOptions& options, c10::Device device)
    : options(options), device(device) {}

ACCELERATE_INLINE CoreState::~CoreState() = default;

}  // namespace accelerate::detail
