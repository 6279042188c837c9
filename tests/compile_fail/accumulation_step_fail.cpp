// Must not compile: an Accumulation policy whose step state lacks load_state_dict(), so it
// does not satisfy step::AccumulationStepState. Twin of accumulation_step_ok.cpp.
#include <accelerate/accelerator.hpp>

struct EveryOther {
  static constexpr std::size_t steps = 2;
  static constexpr bool dynamic = false;
};

template <>
class accelerate::step::AccumulationStep<EveryOther> : public accelerate::step::AccumulationStep<accelerate::Accumulate<2>> {
  using Base = accelerate::step::AccumulationStep<accelerate::Accumulate<2>>;

 public:
  using Base::Base;
  void load_state_dict(const accelerate::StateDict&) = delete;  // hides the window's
};

accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, EveryOther> acc;
