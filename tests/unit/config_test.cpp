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

}  // namespace
