// Must not compile: a Clip policy whose step state has no apply(), so it does not satisfy
// step::ClipStepState. Twin of clip_step_ok.cpp.
#include <accelerate/accelerator.hpp>

struct Unclipped {
  using slot = accelerate::ClipSlotTag;
  static constexpr std::string_view name = "Unclipped";
};

template <>
class accelerate::step::ClipStep<Unclipped> {
 public:
  static constexpr bool active = true;
};

accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::NoAccumulation, Unclipped> acc;
