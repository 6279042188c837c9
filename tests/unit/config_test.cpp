// Tests of config.hpp: YAML files with the keys of Accelerate's default_config.yaml.
#include <accelerate/config.hpp>

#include <gtest/gtest.h>

#include <fstream>

#include "../support/errors.hpp"
#include "../support/temp_dir.hpp"

namespace {

using accelerate::testing::TempDir;
using accelerate::testing::error_of;

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

// Accelerate's DeepSpeed configuration: the ZeRO stage, accumulation and clipping are read; the
// transport follows use_cpu; offloading is refused rather than ignored.
TEST(YamlConfig, DeepSpeedConfigSelectsTheZeroStage) {
  TempDir dir;
  std::ofstream(dir / "zero.yaml") << "compute_environment: LOCAL_MACHINE\n"
                                      "distributed_type: DEEPSPEED\n"
                                      "deepspeed_config:\n"
                                      "  gradient_accumulation_steps: 4\n"
                                      "  gradient_clipping: 1.0\n"
                                      "  offload_optimizer_device: none\n"
                                      "  offload_param_device: none\n"
                                      "  zero3_init_flag: false\n"
                                      "  zero_stage: 2\n"
                                      "num_processes: 2\n"
                                      "use_cpu: true\n";
  auto config = accelerate::load_run_config(dir / "zero.yaml");
  EXPECT_EQ(config.resolved_distributed_type(), "MULTI_CPU");
  EXPECT_EQ(config.zero_stage, 2);
  EXPECT_EQ(config.gradient_accumulation_steps, 4u);
  EXPECT_EQ(config.max_grad_norm, 1.0);
  std::ofstream(dir / "gpu.yaml") << "distributed_type: DEEPSPEED\ndeepspeed_config: {zero_stage: 3}\n";
  config = accelerate::load_run_config(dir / "gpu.yaml");
  EXPECT_EQ(config.resolved_distributed_type(), "MULTI_GPU");
  EXPECT_EQ(config.zero_stage, 3);

  std::ofstream(dir / "offload.yaml") << "distributed_type: DEEPSPEED\n"
                                         "deepspeed_config: {zero_stage: 3, offload_param_device: cpu}\n";
  auto message = error_of([&] { accelerate::load_run_config(dir / "offload.yaml"); });
  EXPECT_NE(message.find("deepspeed_config.offload_param_device is 'cpu'; valid values: none"), std::string::npos)
      << message;
  std::ofstream(dir / "no_stage.yaml") << "distributed_type: DEEPSPEED\n";
  message = error_of([&] { accelerate::load_run_config(dir / "no_stage.yaml"); });
  EXPECT_NE(message.find("DEEPSPEED needs deepspeed_config.zero_stage"), std::string::npos) << message;
  std::ofstream(dir / "not_deepspeed.yaml") << "distributed_type: MULTI_CPU\ndeepspeed_config: {zero_stage: 2}\n";
  message = error_of([&] { accelerate::load_run_config(dir / "not_deepspeed.yaml"); });
  EXPECT_NE(message.find("deepspeed_config is read only with distributed_type: DEEPSPEED"), std::string::npos)
      << message;
  std::ofstream(dir / "stage.yaml") << "distributed_type: DEEPSPEED\ndeepspeed_config: {zero_stage: 4}\n";
  message = error_of([&] { accelerate::load_run_config(dir / "stage.yaml"); });
  EXPECT_NE(message.find("deepspeed_config.zero_stage is 4; valid values: 0, 1, 2, 3"), std::string::npos) << message;
  std::ofstream(dir / "typo.yaml") << "distributed_type: DEEPSPEED\ndeepspeed_config: {zero_stag: 2}\n";
  message = error_of([&] { accelerate::load_run_config(dir / "typo.yaml"); });
  EXPECT_NE(message.find("unknown key 'deepspeed_config.zero_stag'; valid keys of deepspeed_config: zero_stage"),
            std::string::npos) << message;
  std::ofstream(dir / "twice.yaml") << "distributed_type: DEEPSPEED\ngradient_accumulation_steps: 2\n"
                                       "deepspeed_config: {zero_stage: 1, gradient_accumulation_steps: 8}\n";
  message = error_of([&] { accelerate::load_run_config(dir / "twice.yaml"); });
  EXPECT_NE(message.find("deepspeed_config.gradient_accumulation_steps is 8 but gradient_accumulation_steps is 2"),
            std::string::npos) << message;
}

TEST(YamlConfig, ClipValueSelectsValueClipping) {
  TempDir dir;
  std::ofstream(dir / "clip.yaml") << "clip_value: 0.25\n";
  EXPECT_EQ(accelerate::load_run_config(dir / "clip.yaml").clip_value, 0.25);
}

}  // namespace
