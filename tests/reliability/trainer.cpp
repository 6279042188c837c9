// A small data-parallel trainer the reliability tests start, kill, signal and resume. It runs
// through accelerate::launch, so it can be one node of a multi-node job too.
//
//   trainer --out DIR [--steps N] [--timeout S] [--step-ms MS]
//           [--die-rank R --die-step S --die-how kill|abort --die-before backward|step]
//           [--zero 1|2|3] (sharded data parallel, Zero<Gloo, N>, instead of Gloo)
//           [--project DIR --checkpoint-every K] [--preemptible]
//           [--samples N]   (dataset size; default 128 per process)
//           [--log-samples] (DIR/seen_rank<r>_attempt<k>.txt: "epoch step index" per sample)
// The --die-* flags act only in a job's first attempt (ACCELERATE_RESTART_COUNT unset or 0).
// Writes DIR/model/model.safetensors (rank 0) when it completes all steps, and
// DIR/preempted when it stopped for a preemption signal after saving its state.
#include <accelerate/accelerate.hpp>
#include <accelerate/distributed/sharded.hpp>

#include <torch/torch.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <thread>

#include <unistd.h>

#include "../support/indexed_dataset.hpp"

struct Counters {
  int64_t optimizer_steps = 0;
};
BOOST_HANA_ADAPT_STRUCT(Counters, optimizer_steps);

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(16, 64))),
        drop(register_module("drop", torch::nn::Dropout(0.1))),
        fc2(register_module("fc2", torch::nn::Linear(64, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(drop(torch::relu(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

struct Args {
  std::filesystem::path out = ".";
  int steps = 40;
  int timeout = 30;
  int step_ms = 0;
  int die_rank = -1, die_step = -1;
  std::string die_how = "kill";
  std::string die_before = "backward";  // or "step": after backward, before the optimizer step
  int zero = 0;
  std::string project;
  int checkpoint_every = 0;
  bool preemptible = false;
  int64_t samples = 0;
  bool log_samples = false;
};

int restart_count() {
  const char* count = std::getenv("ACCELERATE_RESTART_COUNT");
  return count ? std::atoi(count) : 0;
}

void die(const Args& a) {
  std::cerr << "trainer: rank " << a.die_rank << " dies (" << a.die_how << ") at step " << a.die_step << " before "
            << a.die_before << std::endl;
  if (a.die_how == "abort") std::abort();
  std::raise(SIGKILL);
}

template <class Backend>
int train(const Args& a) {
  using namespace std::chrono;
  accelerate::AcceleratorOptions options{.seed = 5, .process_group = {.timeout = seconds(a.timeout)}};
  if (!a.project.empty())
    options.project = {.project_dir = a.project, .automatic_checkpoint_naming = true, .total_limit = 3};
  accelerate::Accelerator<Backend> acc{options};
  std::optional<accelerate::PreemptionGuard> guard;
  if (a.preemptible) guard.emplace();

  std::ofstream(a.out / ("rank" + std::to_string(acc.process_index()) + ".pid")) << ::getpid() << "\n";
  Net net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const auto world = static_cast<int64_t>(acc.num_processes());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(77);
  auto x = torch::randn({a.samples > 0 ? a.samples : 16 * 8 * world, 16}, gen);
  accelerate::testing::IndexedDataset data{x, x.narrow(1, 0, 4).sin()};
  auto [model, opt, loader] = acc.prepare(net, sgd, accelerate::DataLoader(data, {.batch_size = 8, .shuffle = true}));
  std::ofstream seen;
  if (a.log_samples)
    seen.open(a.out / ("seen_rank" + std::to_string(acc.process_index()) + "_attempt" +
                       std::to_string(restart_count()) + ".txt"));
  Counters counters;
  acc.register_for_checkpointing(counters);
  if (!a.project.empty() && !accelerate::checkpoint::list_checkpoints(std::filesystem::path(a.project) / "checkpoints").empty())
    acc.load_state();

  while (counters.optimizer_steps < a.steps) {
    for (auto& [bx, by, bi] : loader) {
      if (seen.is_open()) {
        for (int64_t i = 0; i < bi.numel(); ++i)
          seen << loader.epoch() << " " << counters.optimizer_steps + 1 << " " << bi[i].template item<int64_t>() << "\n";
        seen.flush();
      }
      const bool dies = acc.process_index() == a.die_rank && counters.optimizer_steps == a.die_step &&
                        restart_count() == 0;
      if (dies && a.die_before == "backward") die(a);
      opt.zero_grad();
      acc.backward(torch::mse_loss(model(bx), by));
      if (dies) die(a);
      opt.step();
      ++counters.optimizer_steps;
      if (a.step_ms > 0) std::this_thread::sleep_for(milliseconds(a.step_ms));
      if (!a.project.empty() && a.checkpoint_every > 0 && counters.optimizer_steps % a.checkpoint_every == 0)
        acc.save_state();
      if (a.preemptible && acc.check_trigger()) {
        acc.save_state();
        if (acc.is_main_process()) std::ofstream(a.out / "preempted") << counters.optimizer_steps << "\n";
        acc.print("trainer: preempted at step", counters.optimizer_steps, "; state saved");
        return 0;
      }
      if (counters.optimizer_steps >= a.steps) break;
    }
  }
  acc.save_model(model, a.out / "model");
  acc.print("trainer: done after", counters.optimizer_steps, "steps");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return accelerate::launch(argc, argv, [](int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      auto value = [&] { return std::string(argv[++i]); };
      if (flag == "--out") a.out = value();
      else if (flag == "--steps") a.steps = std::stoi(value());
      else if (flag == "--timeout") a.timeout = std::stoi(value());
      else if (flag == "--step-ms") a.step_ms = std::stoi(value());
      else if (flag == "--die-rank") a.die_rank = std::stoi(value());
      else if (flag == "--die-step") a.die_step = std::stoi(value());
      else if (flag == "--die-how") a.die_how = value();
      else if (flag == "--die-before") a.die_before = value();
      else if (flag == "--zero") a.zero = std::stoi(value());
      else if (flag == "--project") a.project = value();
      else if (flag == "--checkpoint-every") a.checkpoint_every = std::stoi(value());
      else if (flag == "--preemptible") a.preemptible = true;
      else if (flag == "--samples") a.samples = std::stoll(value());
      else if (flag == "--log-samples") a.log_samples = true;
      else {
        std::cerr << "trainer: unknown flag " << flag << "\n";
        return 2;
      }
    }
    try {
      std::filesystem::create_directories(a.out);
      if (a.zero == 1) return train<accelerate::Zero<accelerate::Gloo, 1>>(a);
      if (a.zero == 2) return train<accelerate::Zero<accelerate::Gloo, 2>>(a);
      if (a.zero == 3) return train<accelerate::Zero<accelerate::Gloo, 3>>(a);
      return train<accelerate::Gloo>(a);
    } catch (const std::exception& e) {
      std::cerr << "trainer: " << e.what() << std::endl;
      return 1;
    }
  });
}
