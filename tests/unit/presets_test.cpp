// Tests of presets.hpp: RunConfig from ACCELERATE_* variables, all_combinations, dispatch.
// Nothing here needs yaml-cpp (config_test.cpp reads YAML files).
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <cstdlib>

#include "../support/errors.hpp"

namespace {

using accelerate::RunConfig;
using accelerate::testing::error_of;

using Presets = accelerate::all_combinations<
    accelerate::type_list<accelerate::SingleProcess, accelerate::Gloo>, accelerate::type_list<accelerate::Fp32, accelerate::Bf16>,
    accelerate::type_list<accelerate::NoAccumulation, accelerate::AccumulateDynamic>,
    accelerate::type_list<accelerate::NoClip, accelerate::ClipNorm<>>>;

template <class Acc>
std::string describe() {
  return std::string(Acc::distributed_type()) + "/" + std::string(Acc::mixed_precision()) + "/" +
         (Acc::accumulating ? "accumulate" : "every-step") + "/" +
         (accelerate::is_clip_norm<typename Acc::clip_policy> ? "clip" : "noclip");
}

TEST(Dispatch, RunsThePresetTheConfigurationSelects) {
  auto pick = [](const RunConfig& c) {
    return accelerate::dispatch(Presets{}, c, []<class Acc>() { return describe<Acc>(); });
  };
  EXPECT_EQ(pick({}), "NO/no/every-step/noclip");
  EXPECT_EQ(pick({.mixed_precision = "bf16", .gradient_accumulation_steps = 4}), "NO/bf16/accumulate/noclip");
  EXPECT_EQ(pick({.num_processes = 2, .max_grad_norm = 1.0}), "MULTI_CPU/no/every-step/clip");
  static_assert(std::is_same_v<Presets, accelerate::all_combinations<
                                            accelerate::type_list<accelerate::SingleProcess, accelerate::Gloo>,
                                            accelerate::type_list<accelerate::Fp32, accelerate::Bf16>,
                                            accelerate::type_list<accelerate::NoAccumulation, accelerate::AccumulateDynamic>,
                                            accelerate::type_list<accelerate::NoClip, accelerate::ClipNorm<>>>>);
}

TEST(Dispatch, AnUnsupportedConfigurationListsWhatIsCompiled) {
  const auto message = error_of([] {
    accelerate::dispatch<accelerate::presets::Cpu, accelerate::presets::CpuBf16>(
        RunConfig{.mixed_precision = "fp16"}, []<class Acc>() { return 0; });
  });
  EXPECT_NE(message.find("no compiled preset implements distributed_type=NO mixed_precision=fp16"), std::string::npos)
      << message;
  EXPECT_NE(message.find("distributed_type=NO mixed_precision=bf16 gradient_accumulation_steps=1"), std::string::npos)
      << message;
}

TEST(RunConfig, ReadsAccelerateVariablesAndAppliesToOptions) {
  ::setenv("ACCELERATE_MIXED_PRECISION", "bf16", 1);
  ::setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "8", 1);
  RunConfig config;
  config.with_environment();
  ::unsetenv("ACCELERATE_MIXED_PRECISION");
  ::unsetenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
  EXPECT_EQ(config.mixed_precision, "bf16");
  EXPECT_EQ(config.gradient_accumulation_steps, 8u);
  EXPECT_EQ(config.apply({}).accumulation.num_steps, 8u);
}

}  // namespace
