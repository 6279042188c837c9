// Compiles: a Clip policy whose step state has the whole interface. Twin of clip_step_fail.cpp.
#include <accelerate/accelerator.hpp>

struct Unclipped {
  using slot = accelerate::ClipSlotTag;
  static constexpr std::string_view name = "Unclipped";
};

template <>
class accelerate::step::ClipStep<Unclipped> {
 public:
  static constexpr bool active = true;
  template <class Engine>
  static void apply(Engine&, const torch::optim::Optimizer&, const accelerate::ClipOptions&) {}
};

accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::NoAccumulation, Unclipped> acc;
