// Compiles: a Precision policy whose step state has the whole interface (it reuses Bf16's).
// Twin of precision_step_fail.cpp.
#include <accelerate/accelerator.hpp>

struct CustomBf16 {
  static constexpr std::string_view name = "bf16-custom";
  static constexpr bool autocast = true;
  static constexpr c10::ScalarType dtype = c10::ScalarType::BFloat16;
};

template <>
class accelerate::step::PrecisionStep<CustomBf16> : public accelerate::step::PrecisionStep<accelerate::Bf16> {
  using Base = accelerate::step::PrecisionStep<accelerate::Bf16>;

 public:
  using Base::Base;
};

accelerate::Accelerator<accelerate::SingleProcess, CustomBf16> acc;
