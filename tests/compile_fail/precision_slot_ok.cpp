// Compiles: a Precision policy in the Precision slot. Twin of precision_slot_fail.cpp.
#include <accelerate/accelerator.hpp>
accelerate::Accelerator<accelerate::SingleProcess, accelerate::Bf16> acc;
