// Compiles: a Clip policy in the Clip slot. Twin of clip_slot_fail.cpp.
#include <accelerate/accelerator.hpp>
accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::NoAccumulation, accelerate::ClipValue> acc;
