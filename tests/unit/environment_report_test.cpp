// Tests of include/accelerate/environment_report.hpp: what a bug report needs to know.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

namespace {

TEST(Environment, ReportNamesVersionsPoliciesAndTheDistributedSetting) {
  const auto report = accelerate::environment_report<accelerate::Accelerator<accelerate::Gloo, accelerate::Bf16>>();
  EXPECT_NE(report.find("accelerate-cpp version: 0.1.0"), std::string::npos) << report;
  EXPECT_NE(report.find("LibTorch version: 2."), std::string::npos) << report;
  EXPECT_NE(report.find("Policies: Backend=accelerate::Gloo Precision=accelerate::Bf16"), std::string::npos) << report;
  EXPECT_NE(report.find("Distributed environment: "), std::string::npos) << report;
  EXPECT_NE(report.find("Gloo backend: compiled in"), std::string::npos) << report;
  EXPECT_NE(report.find("CPU tensors on huge pages: "), std::string::npos) << report;
}

}  // namespace
