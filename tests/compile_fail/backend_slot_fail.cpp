// Must not compile: a Precision policy in the Backend slot. Twin of backend_slot_ok.cpp.
#include <accelerate/accelerator.hpp>
accelerate::Accelerator<accelerate::Fp32> acc;
