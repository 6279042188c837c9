// Tests of presets.hpp (RunConfig, all_combinations, dispatch) and config.hpp (YAML files with
// the keys of Accelerate's default_config.yaml).
#include <accelerate/accelerate.hpp>
#include <accelerate/config.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "../support/errors.hpp"
#include "../support/temp_dir.hpp"

namespace {

using accelerate::RunConfig;
using accelerate::testing::TempDir;

using accelerate::testing::error_of;

using Presets = accelerate::all_combinations<
    accelerate::type_list<accelerate::SingleProcess, accelerate::Gloo>, accelerate::type_list<accelerate::Fp32, accelerate::Bf16>,
    accelerate::type_list<accelerate::NoAccumulation, accelerate::AccumulateDynamic>,
    accelerate::type_list<accelerate::NoClip, accelerate::ClipNorm<>>>;

template <class Acc>
std::string describe() {
  return std::string(Acc::distributed_type()) + "/" + std::string(Acc::mixed_precision()) + "/" +
         (Acc::accumulating ? "accumulate" : "every-step") + "/" +
         (Acc::clip_policy::kind == accelerate::ClipKind::norm ? "clip" : "noclip");
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
  EXPECT_EQ(config.apply({}).gradient_accumulation_steps, 8u);
}

TEST(YamlConfig, ReadsAccelerateConfigFiles) {
  TempDir dir;
  std::ofstream(dir / "default_config.yaml") << "compute_environment: LOCAL_MACHINE\n"
                                                "distributed_type: MULTI_CPU\n"
                                                "mixed_precision: bf16\n"
                                                "num_processes: 2\n"
                                                "gradient_accumulation_steps: 4\n"
                                                "use_cpu: true\n";
  const auto config = accelerate::load_run_config(dir / "default_config.yaml");
  EXPECT_EQ(config.resolved_distributed_type(), "MULTI_CPU");
  EXPECT_EQ(config.mixed_precision, "bf16");
  EXPECT_EQ(config.num_processes, 2);
  EXPECT_EQ(config.gradient_accumulation_steps, 4u);
}

TEST(YamlConfig, UnknownKeysAndValuesListTheValidOnes) {
  TempDir dir;
  std::ofstream(dir / "a.yaml") << "mixed_precision: fp8\n";
  auto message = error_of([&] { accelerate::load_run_config(dir / "a.yaml"); });
  EXPECT_NE(message.find("mixed_precision is 'fp8'; valid values: no, bf16, fp16"), std::string::npos) << message;
  std::ofstream(dir / "b.yaml") << "num_proceses: 2\n";
  message = error_of([&] { accelerate::load_run_config(dir / "b.yaml"); });
  EXPECT_NE(message.find("unknown key 'num_proceses'; valid keys: distributed_type, mixed_precision, num_processes"),
            std::string::npos) << message;
  std::ofstream(dir / "c.yaml") << "num_processes: many\n";
  message = error_of([&] { accelerate::load_run_config(dir / "c.yaml"); });
  EXPECT_NE(message.find("num_processes' has value 'many'"), std::string::npos) << message;
  std::ofstream(dir / "d.yaml") << "{ unbalanced\n";
  message = error_of([&] { accelerate::load_run_config(dir / "d.yaml"); });
  EXPECT_NE(message.find("cannot read it as YAML"), std::string::npos) << message;
}

}  // namespace
