// What every multi-process test file starts with: the seeded models, the process runner, and
// their names, brought into the file's unnamed namespace by
//   using namespace accelerate::testing::prelude;
#pragma once

#include <chrono>

#include "models.hpp"
#include "multiprocess.hpp"

namespace accelerate::testing::prelude {

using namespace std::chrono_literals;
using accelerate::testing::flat_gradients;
using accelerate::testing::flat_parameters;
using accelerate::testing::job_dir;
using accelerate::testing::JobOptions;
using accelerate::testing::load_tensor;
using accelerate::testing::parameter_bytes;
using accelerate::testing::regression_data;
using accelerate::testing::run_job;
using accelerate::testing::save_tensor;
using accelerate::testing::TinyNet;
using accelerate::testing::worker_arguments;

}  // namespace accelerate::testing::prelude
