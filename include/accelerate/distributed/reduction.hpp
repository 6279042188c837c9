// Reduction: how Accelerator::reduce() and the engines combine values across processes.
#pragma once

namespace accelerate {

/// Element-wise combination across processes (Accelerate's reduce(reduction=...)).
enum class Reduction { sum, mean, max, min };

}  // namespace accelerate
