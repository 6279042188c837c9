// Fashion-MNIST with accelerate-cpp: the library's main job. A plain LibTorch training loop
// written once; the Accelerator's policies decide how it runs. The last line printed is one
// JSON object describing the run.
#include <accelerate/accelerate.hpp>
#include <accelerate/data/idx.hpp>             // optional: the Fashion-MNIST files' reader
#include <accelerate/distributed/sharded.hpp>  // optional: Zero<Gloo, N> (--zero N)
#ifdef ACCELERATE_EXAMPLE_YAML
#include <accelerate/config.hpp>
#endif

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <vector>
#include <string>

#include <nlohmann/json.hpp>

#include "flag_values.hpp"

namespace {

struct Args {
  int epochs = 1;
  std::size_t batch_size = 64;
  double lr = 1e-3;
  std::uint64_t seed = 42;
  std::string data = accelerate::data::fashion_mnist_default_dir.string();
  bool progress = true;
  std::size_t max_train_samples = 0;  // train on the first N samples only (0: all), for quick runs
  std::size_t workers = 0;  // dataloader threads reading batches ahead (the results do not change)
  std::string project_dir;  // checkpoint every epoch here; the final model in <dir>/model
  bool resume = false;      // continue from the latest checkpoint in project_dir
  std::vector<std::string> log_with;  // trackers: jsonl, csv, tensorboard, all
  bool env = false;         // print the environment report and exit
  bool estimate_memory = false;  // print the bytes each rank holds for the model and exit
  bool check_finite_loss = true;  // a NaN/inf loss stops training, naming the step
  int zero_stage = 0;  // 1-3: sharded data parallel (Zero<Gloo, N>) instead of Gloo
  accelerate::RunConfig run;  // precision, accumulation, clipping, processes
  // How gradient buckets travel (a run-time option: no extra compiled combination).
  accelerate::GradientCompression compression = accelerate::GradientCompression::none;
  accelerate::PowerSgdOptions power_sgd{.rank = 4, .start_iteration = 10};
};

// Counters that survive a resume: saved with the training state through Boost.Hana.
struct Progress {
  std::int64_t micro_steps = 0;
  std::int64_t optimizer_steps = 0;
  double last_epoch_loss = 0.0;
};

[[noreturn]] void usage(const std::string& problem) {
  std::cerr << "fashion_mnist: " << problem << "\n"
            << "usage: fashion_mnist [--nproc N] [--epochs N] [--batch-size N] [--lr X] [--seed N]\n"
            << "                     [--data DIR] [--precision fp32|bf16|fp16] [--accum K]\n"
            << "                     [--clip-norm X] [--project-dir DIR [--resume]] [--max-train-samples N]\n"
            << "                     [--log-with jsonl,csv,tensorboard|all] [--no-progress] [--env]\n"
            << "                     [--estimate-memory]   (bytes per rank for the model, then exit)\n"
            << "                     [--allow-nonfinite-loss] [--workers N] [--zero 1|2|3]\n"
            << "                     [--compression none|fp16|bf16|power_sgd [--power-sgd-rank R]\n"
            << "                      [--power-sgd-start STEPS]]\n"
            << "                     [--config default_config.yaml]   (precedence: flags, then ACCELERATE_*\n"
            << "                                                       variables, then the file)\n";
  std::exit(2);
}

// The value of `--config FILE` in argv, if any.
std::optional<std::string> config_file(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--config") return std::string(argv[i + 1]);
  return std::nullopt;
}

// The run configuration a YAML file gives (Accelerate's default_config.yaml keys).
accelerate::RunConfig file_config(const std::optional<std::string>& path) {
  if (!path) return {};
#ifdef ACCELERATE_EXAMPLE_YAML
  return accelerate::load_run_config(*path);
#else
  usage("--config needs yaml-cpp, which this build lacks");
#endif
}

Args parse(int argc, char** argv) {
  Args a;
  a.run = file_config(config_file(argc, argv));
  a.run.with_environment();
  a.run.num_processes = accelerate::distributed::detect_environment().world_size;
  examples::for_each_flag(argc, argv, usage, [&](const std::string& flag, auto& value) {
    if (flag == "--epochs") a.epochs = examples::whole_number<int>(flag, value(), usage);
    else if (flag == "--batch-size") a.batch_size = examples::whole_number<std::size_t>(flag, value(), usage);
    else if (flag == "--lr") a.lr = examples::real_number(flag, value(), usage);
    else if (flag == "--seed") a.seed = examples::whole_number<std::uint64_t>(flag, value(), usage);
    else if (flag == "--data") a.data = value();
    else if (flag == "--no-progress") a.progress = false;
    else if (flag == "--workers") a.workers = examples::whole_number<std::size_t>(flag, value(), usage);
    else if (flag == "--zero") a.zero_stage = examples::whole_number<int>(flag, value(), usage);
    else if (flag == "--max-train-samples") a.max_train_samples = examples::whole_number<std::size_t>(flag, value(), usage);
    else if (flag == "--project-dir") a.project_dir = value();
    else if (flag == "--resume") a.resume = true;
    else if (flag == "--env") a.env = true;
    else if (flag == "--estimate-memory") a.estimate_memory = true;
    else if (flag == "--allow-nonfinite-loss") a.check_finite_loss = false;
    else if (flag == "--config") value();  // read before the other flags
    else if (flag == "--log-with") {
      std::stringstream list(value());
      for (std::string name; std::getline(list, name, ',');) a.log_with.push_back(name);
    }
    else if (flag == "--accum") a.run.gradient_accumulation_steps = examples::whole_number<std::size_t>(flag, value(), usage);
    else if (flag == "--clip-norm") a.run.max_grad_norm = examples::real_number(flag, value(), usage);
    else if (flag == "--power-sgd-rank") a.power_sgd.rank = examples::whole_number<int>(flag, value(), usage);
    else if (flag == "--power-sgd-start") a.power_sgd.start_iteration = examples::whole_number<std::size_t>(flag, value(), usage);
    else if (flag == "--compression") {
      const std::string c = value();
      if (c == "none") a.compression = accelerate::GradientCompression::none;
      else if (c == "fp16") a.compression = accelerate::GradientCompression::fp16;
      else if (c == "bf16") a.compression = accelerate::GradientCompression::bf16;
      else if (c == "power_sgd") a.compression = accelerate::GradientCompression::power_sgd;
      else usage("--compression must be none, fp16, bf16 or power_sgd");
    }
    else if (flag == "--precision") {
      const std::string p = value();
      if (p != "fp32" && p != "bf16" && p != "fp16") usage("--precision must be fp32, bf16 or fp16");
      a.run.mixed_precision = p == "fp32" ? "no" : p;
    } else usage("unknown flag " + flag);
  });
  if (a.epochs < 1 || a.batch_size < 1 || !(a.lr > 0) || a.run.gradient_accumulation_steps < 1)
    usage("--epochs, --batch-size, --lr and --accum must be positive");
  if (a.run.max_grad_norm && *a.run.max_grad_norm < 0) usage("--clip-norm must not be negative");
  if (a.resume && a.project_dir.empty()) usage("--resume needs --project-dir");
  if (a.zero_stage > 3) usage("--zero must be 1, 2 or 3 (0: data parallel)");
  if (a.zero_stage > 0 && a.run.mixed_precision != "no") usage("--zero runs in fp32 only (in this example)");
  if (a.zero_stage > 0 && a.compression != accelerate::GradientCompression::none)
    usage("--zero shards gradients; --compression is for data parallel");
  return a;
}

}  // namespace

BOOST_HANA_ADAPT_STRUCT(Progress, micro_steps, optimizer_steps, last_epoch_loss);

namespace {

/// A small CNN: two 5x5 convolutions with max pooling, then a linear classifier.
struct ClassifierImpl : torch::nn::Module {
  ClassifierImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5).padding(2)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5).padding(2)))),
        fc(register_module("fc", torch::nn::Linear(32 * 7 * 7, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::max_pool2d(torch::relu(conv1(x.view({-1, 1, 28, 28}))), 2);
    h = torch::max_pool2d(torch::relu(conv2(h)), 2);
    return fc(h.flatten(1));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc;
};
TORCH_MODULE(Classifier);

template <class Acc>
int train(const Args& args) {
  const auto start = std::chrono::steady_clock::now();
  if (args.env) {
    std::cout << accelerate::environment_report<Acc>();
    return 0;
  }
  accelerate::AcceleratorOptions options{.seed = args.seed, .check_finite_loss = args.check_finite_loss};
  options.ddp.compression = args.compression;
  options.ddp.power_sgd = args.power_sgd;
  options.tracking.log_with = args.log_with;
  if (!args.project_dir.empty())
    options.project = {.project_dir = args.project_dir, .automatic_checkpoint_naming = true, .total_limit = 2};
  // The sharded presets below accumulate and clip by norm at run time: one micro-step per
  // step without --accum, and without --clip-norm the norm is only measured (the largest
  // double as the bound never scales).
  if constexpr (requires { Acc::backend_policy::stage; }) {
    options.accumulation.num_steps = args.run.gradient_accumulation_steps;
    if (!args.run.max_grad_norm) options.clip.max_norm = std::numeric_limits<double>::max();
  }
  Acc acc{args.run.apply(options)};
  if (args.estimate_memory) {
    // What each rank holds for the model under this configuration: no data needed.
    Classifier net;
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(args.lr));
    auto [model, optimizer] = acc.prepare(net, adam);
    const accelerate::MemoryEstimate estimate = accelerate::estimate_memory(acc, model, optimizer);
    acc.print("memory per rank with", acc.distributed_type(), acc.mixed_precision(), "on", acc.num_processes(),
              "process(es):", estimate);
    if (acc.is_main_process())
      std::cout << nlohmann::json{{"world_size", acc.num_processes()},
                                  {"precision", std::string(acc.mixed_precision())},
                                  {"parameter_bytes", estimate.parameters},
                                  {"gradient_bytes", estimate.gradients},
                                  {"optimizer_state_bytes", estimate.optimizer_state},
                                  {"total_bytes", estimate.total()}}
                       .dump()
                << std::endl;
    return 0;
  }
  auto train_set = accelerate::data::load_fashion_mnist(args.data, /*train=*/true);
  if (args.max_train_samples > 0 && args.max_train_samples < train_set.size().value()) {
    const auto n = static_cast<std::int64_t>(args.max_train_samples);
    train_set = accelerate::data::TensorDataset(train_set.inputs().narrow(0, 0, n), train_set.targets().narrow(0, 0, n));
  }
  const auto test_set = accelerate::data::load_fashion_mnist(args.data, /*train=*/false);

  Classifier net;
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(args.lr));
  auto [model, optimizer, train_loader, test_loader] = acc.prepare(
      net, adam,
      accelerate::DataLoader(train_set, {.batch_size = args.batch_size, .shuffle = true, .num_workers = args.workers}),
      accelerate::DataLoader(test_set, {.batch_size = 256, .num_workers = args.workers}));
  Progress progress;
  acc.register_for_checkpointing(progress);
  if (args.resume) acc.print("resuming from", acc.load_state().string());
  acc.init_trackers("fashion_mnist", {{"epochs", args.epochs}, {"batch_size", args.batch_size}, {"lr", args.lr},
                                      {"seed", args.seed}, {"precision", std::string(acc.mixed_precision())},
                                      {"accum", acc.gradient_accumulation_steps()}, {"world_size", acc.num_processes()}});

  for (int epoch = static_cast<int>(train_loader.epoch()); epoch < args.epochs; ++epoch) {
    model->train();
    accelerate::ProgressBar bar(train_loader.size(),
                                {.enabled = acc.is_main_process() && args.progress,
                                 .description = "epoch " + std::to_string(epoch + 1)});
    torch::Tensor loss_sum = torch::zeros({}, torch::kDouble);
    std::size_t batches = 0;
    for (auto& [x, y] : train_loader) {
      auto step = acc.accumulate(model);
      auto loss = torch::cross_entropy_loss(model(x), y);
      acc.backward(loss);
      optimizer.step();
      optimizer.zero_grad();
      ++progress.micro_steps;
      if (step.sync_gradients() && !acc.optimizer_step_was_skipped()) ++progress.optimizer_steps;
      loss_sum += loss.detach().to(torch::kDouble).cpu();
      ++batches;
      const double loss_value = loss.template item<double>();
      bar.update(loss_value);
      if (progress.micro_steps % 100 == 0) {
        // The last synchronised step's communication: how long training waited for it.
        const auto comm = acc.stats().last_step;
        acc.log({{"train/loss", loss_value},
                 {"train/lr", adam.param_groups()[0].options().get_lr()},
                 {"comm/exposed_ms", 1e3 * comm.exposed_seconds},
                 {"comm/busy_ms", 1e3 * comm.busy_seconds}},
                progress.micro_steps);
      }
    }
    bar.close();
    progress.last_epoch_loss = acc.reduce(loss_sum, accelerate::Reduction::mean).template item<double>() /
                               static_cast<double>(batches);
    if (!args.project_dir.empty()) acc.save_state();
  }
  if (!args.project_dir.empty()) acc.save_model(model, std::filesystem::path(args.project_dir) / "model");

  model->eval();
  torch::NoGradGuard no_grad;
  std::int64_t correct = 0, total = 0;
  for (auto& [x, y] : test_loader) {
    auto predictions = acc.gather_for_metrics(model(x).argmax(1));
    auto labels = acc.gather_for_metrics(y);
    correct += predictions.eq(labels).sum().template item<std::int64_t>();
    total += labels.size(0);
  }

  const double accuracy = static_cast<double>(correct) / static_cast<double>(total);
  acc.log({{"test/accuracy", accuracy}, {"train/epoch_loss", progress.last_epoch_loss}}, progress.micro_steps);
  acc.end_training();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (acc.is_main_process()) {
    nlohmann::json report = {
        {"world_size", acc.num_processes()},
        {"backend", std::string(Acc::backend_policy::name)},
        {"precision", std::string(acc.mixed_precision())},
        {"accum", acc.gradient_accumulation_steps()},
        {"epochs", args.epochs},
        {"micro_steps", progress.micro_steps},
        {"optimizer_steps", progress.optimizer_steps},
        {"allreduce_calls", acc.stats().allreduce.calls},
        {"compression", accelerate::to_string(args.compression)},
        {"gradient_bytes_sent", acc.stats().gradient_allreduce.bytes},
        // Time on collectives (seconds): in flight, and the part training waited for.
        {"comm_seconds", acc.stats().time.busy_seconds},
        {"comm_exposed_seconds", acc.stats().time.exposed_seconds},
        {"comm_overlap", acc.stats().time.overlap()},
        {"train_loss", progress.last_epoch_loss},
        {"test_samples", total},
        {"test_accuracy", accuracy},
        {"seconds", seconds},
    };
    std::cout << report.dump() << std::endl;
  }
  return 0;
}

}  // namespace

// --zero N: one preset per stage, fp32, accumulation and clipping chosen at run time (three
// more compiled Accelerators rather than every combination again).
template <int Stage>
using Sharded = accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, Stage>, accelerate::Fp32,
                                        accelerate::AccumulateDynamic, accelerate::ClipNorm<>>;

// Every combination the flags can ask for is compiled; dispatch() runs the one they select.
using Supported = accelerate::all_combinations<
    accelerate::type_list<accelerate::SingleProcess, accelerate::Gloo>,
    accelerate::type_list<accelerate::Fp32, accelerate::Bf16, accelerate::Fp16>,
    accelerate::type_list<accelerate::NoAccumulation, accelerate::AccumulateDynamic>,
    accelerate::type_list<accelerate::NoClip, accelerate::ClipNorm<>>>;

int main(int argc, char** argv) {
  // A config file's num_processes starts that many ranks unless --nproc or the variable says.
  try {
    const auto config = file_config(config_file(argc, argv));
    if (config.num_processes > 1) ::setenv("ACCELERATE_NUM_PROCESSES", std::to_string(config.num_processes).c_str(), 0);
  } catch (const accelerate::Error& e) {
    std::cerr << "fashion_mnist: " << e.what() << "\n";
    return 2;
  }
  return accelerate::launch(argc, argv, [](int argc, char** argv) {
    try {
      const Args args = parse(argc, argv);
      if (args.zero_stage == 1) return train<Sharded<1>>(args);
      if (args.zero_stage == 2) return train<Sharded<2>>(args);
      if (args.zero_stage == 3) return train<Sharded<3>>(args);
      return accelerate::dispatch(Supported{}, args.run, [&]<class Acc>() { return train<Acc>(args); });
    } catch (const accelerate::Error& e) {
      std::cerr << "fashion_mnist: " << e.what() << "\n";
      return 1;
    }
  });
}
