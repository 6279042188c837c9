// Compiles: a Backend policy in the Backend slot. Twin of backend_slot_fail.cpp.
#include <accelerate/accelerator.hpp>
accelerate::Accelerator<accelerate::SingleProcess> acc;
