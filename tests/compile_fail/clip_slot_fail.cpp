// Must not compile: a Backend policy in the Clip slot. Twin of clip_slot_ok.cpp.
#include <accelerate/accelerator.hpp>
accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::NoAccumulation, accelerate::Gloo> acc;
