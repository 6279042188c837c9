// Must not compile: a plain number type in the Accumulation slot. Twin of accumulation_slot_ok.cpp.
#include <accelerate/accelerator.hpp>
accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, int> acc;
