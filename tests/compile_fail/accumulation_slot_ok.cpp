// Compiles: an Accumulation policy in the Accumulation slot. Twin of accumulation_slot_fail.cpp.
#include <accelerate/accelerator.hpp>
accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::Accumulate<2>> acc;
