// Must not compile: a Clip policy in the Precision slot. Twin of precision_slot_ok.cpp.
#include <accelerate/accelerator.hpp>
accelerate::Accelerator<accelerate::SingleProcess, accelerate::NoClip> acc;
