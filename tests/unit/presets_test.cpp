// Tests of presets.hpp and run_config.hpp: RunConfig from ACCELERATE_* variables, each slot's
// selection rule, all_combinations, dispatch.
// Nothing here needs yaml-cpp (config_test.cpp reads YAML files).
#include <accelerate/accelerate.hpp>
#include <accelerate/distributed/sharded.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <string_view>

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

// A ClipValue preset used to match a configuration that asks for no clipping (it is not a
// ClipNorm, the only thing the old rule looked at), so listed first it ran instead of NoClip.
TEST(Dispatch, ClipValueIsSelectedOnlyByAClipValue) {
  using ClipsValue = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::NoAccumulation,
                                             accelerate::ClipValue>;
  auto pick = [](const RunConfig& c) {
    return accelerate::dispatch<ClipsValue, accelerate::presets::Cpu, accelerate::presets::CpuClip>(
        c, []<class Acc>() { return std::string(Acc::clip_policy::name); });
  };
  EXPECT_EQ(pick({}), "NoClip");
  EXPECT_EQ(pick({.max_grad_norm = 1.0}), "ClipNorm");
  EXPECT_EQ(pick({.clip_value = 0.5}), "ClipValue");
  EXPECT_EQ(RunConfig{.clip_value = 0.5}.apply({}).clip.clip_value, 0.5);
  const auto both = error_of([&] { pick({.max_grad_norm = 1.0, .clip_value = 0.5}); });
  EXPECT_NE(both.find("max_grad_norm=set clip_value=set"), std::string::npos) << both;
}

// Accelerate's zero_stage selects the ZeRO stage; no stage never runs a sharded preset, and a
// stage runs nothing but its own (no silent fall back to data parallel).
TEST(Dispatch, ZeroStageSelectsTheShardedBackend) {
  using Gloo = accelerate::Gloo;
  using Sharded = accelerate::type_list<accelerate::Accelerator<accelerate::Zero<Gloo, 1>>, accelerate::Accelerator<Gloo>,
                                        accelerate::Accelerator<accelerate::Zero<Gloo, 3>>,
                                        accelerate::Accelerator<accelerate::Zero<Gloo, 2>>>;
  auto pick = [](const RunConfig& c) {
    return accelerate::dispatch(Sharded{}, c, []<class Acc>() { return std::string(Acc::backend_policy::name); });
  };
  EXPECT_EQ(pick({.num_processes = 2}), "Gloo");
  EXPECT_EQ(pick({.num_processes = 2, .zero_stage = 0}), "Gloo");
  EXPECT_EQ(pick({.num_processes = 2, .zero_stage = 1}), "Zero<Gloo,1>");
  EXPECT_EQ(pick({.num_processes = 2, .zero_stage = 2}), "Zero<Gloo,2>");
  EXPECT_EQ(pick({.num_processes = 2, .zero_stage = 3}), "Zero<Gloo,3>");
  // Over NCCL, or with no stage compiled for it: an error naming the stage and the presets.
  auto message = error_of([&] { pick({.distributed_type = "MULTI_GPU", .zero_stage = 2}); });
  EXPECT_NE(message.find("distributed_type=MULTI_GPU"), std::string::npos) << message;
  EXPECT_NE(message.find("zero_stage=2"), std::string::npos) << message;
  EXPECT_NE(message.find("Backend=accelerate::Zero<accelerate::Gloo, 2>"), std::string::npos) << message;
  message = error_of([] {
    accelerate::dispatch<accelerate::presets::MultiCpu>(RunConfig{.num_processes = 2, .zero_stage = 2},
                                                      []<class Acc>() { return 0; });
  });
  EXPECT_NE(message.find("zero_stage=2"), std::string::npos) << message;
}

// A policy states its own rule with a static selected_by; dispatch needs no edit to use it.
struct ClipAboveTen {
  using slot = accelerate::ClipSlotTag;
  static constexpr std::string_view name = "ClipAboveTen";
  static bool selected_by(const RunConfig& c) { return c.max_grad_norm.value_or(0) > 10; }
};
struct UnselectableClip {
  using slot = accelerate::ClipSlotTag;
  static constexpr std::string_view name = "UnselectableClip";
};
struct Fp16AsHalfTrue {  // a Precision policy selected by a name Accelerate does not use
  static constexpr std::string_view name = "fp16-true";
  static constexpr bool autocast = true;
  static constexpr c10::ScalarType dtype = c10::ScalarType::Half;
};

TEST(Dispatch, APolicyStatesHowAConfigurationSelectsIt) {
  using accelerate::detail::clip_selected_by;
  EXPECT_TRUE(clip_selected_by<ClipAboveTen>(RunConfig{.max_grad_norm = 12.0}));
  EXPECT_FALSE(clip_selected_by<ClipAboveTen>(RunConfig{.max_grad_norm = 1.0}));
  EXPECT_FALSE(clip_selected_by<UnselectableClip>(RunConfig{}));  // no rule: never selected
  EXPECT_FALSE(clip_selected_by<accelerate::ClipNormInf>(RunConfig{.max_grad_norm = 1.0}));
  // Slot rules for policies that state none, from the facts their concept requires.
  using accelerate::detail::precision_selected_by;
  EXPECT_TRUE(precision_selected_by<Fp16AsHalfTrue>(RunConfig{.mixed_precision = "fp16-true"}));
  EXPECT_FALSE(precision_selected_by<Fp16AsHalfTrue>(RunConfig{.mixed_precision = "fp16"}));
  using accelerate::detail::accumulation_selected_by;
  EXPECT_TRUE(accumulation_selected_by<accelerate::Accumulate<4>>(RunConfig{.gradient_accumulation_steps = 4}));
  EXPECT_FALSE(accumulation_selected_by<accelerate::Accumulate<4>>(RunConfig{.gradient_accumulation_steps = 2}));
  EXPECT_TRUE(accumulation_selected_by<accelerate::NoAccumulation>(RunConfig{}));
  using accelerate::detail::backend_selected_by;
  EXPECT_FALSE(backend_selected_by<accelerate::SingleProcess>(RunConfig{.num_processes = 2}));
  EXPECT_FALSE(backend_selected_by<accelerate::Nccl>(RunConfig{.num_processes = 2}));
  EXPECT_TRUE(backend_selected_by<accelerate::Nccl>(RunConfig{.distributed_type = "MULTI_GPU", .num_processes = 2}));
}

TEST(RunConfig, ReadsAccelerateVariablesAndAppliesToOptions) {
  ::setenv("ACCELERATE_MIXED_PRECISION", "bf16", 1);
  ::setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "8", 1);
  RunConfig config;
  config.with_environment();
  ::unsetenv("ACCELERATE_MIXED_PRECISION");
  ::unsetenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
  EXPECT_FALSE(config.zero_stage.has_value());
  ::setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3", 1);
  config.with_environment();
  ::unsetenv("ACCELERATE_DEEPSPEED_ZERO_STAGE");
  EXPECT_EQ(config.zero_stage, 3);
  EXPECT_EQ(config.mixed_precision, "bf16");
  EXPECT_EQ(config.gradient_accumulation_steps, 8u);
  EXPECT_EQ(config.apply({}).accumulation.num_steps, 8u);
}

}  // namespace
