// Compiles: an Accumulation policy whose step state has the whole interface (Accumulate<2>'s).
// Twin of accumulation_step_fail.cpp.
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
};

accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, EveryOther> acc;
