// The umbrella header for trainers and examples: everything but the NCCL backend
// (<accelerate/distributed/nccl.hpp>), YAML configurations (<accelerate/config.hpp>) and the
// optional IDX (MNIST-family) reader (<accelerate/data/idx.hpp>).
// Library headers never include it.
#pragma once

#include <accelerate/accelerator.hpp>
#include <accelerate/checkpoint/reflect.hpp>
#include <accelerate/data/tensor_dataset.hpp>
#include <accelerate/distributed/process_group.hpp>
#include <accelerate/distributed/units.hpp>
#include <accelerate/environment_report.hpp>
#include <accelerate/launch/launch.hpp>
#include <accelerate/launch/preemption.hpp>
#include <accelerate/memory/activation_checkpoint.hpp>
#include <accelerate/memory/estimate.hpp>
#include <accelerate/optim/fused_adam.hpp>
#include <accelerate/optim/warmup_cosine.hpp>
#include <accelerate/presets.hpp>
#include <accelerate/track/csv.hpp>
#include <accelerate/track/jsonl.hpp>
#include <accelerate/track/progress.hpp>
#include <accelerate/track/tensorboard.hpp>
#include <accelerate/version.hpp>
