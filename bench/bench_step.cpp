// bench_step: the price of the Accelerator on one process. The same model, data and optimizer
// stepped by a hand-written LibTorch loop (BM_RawLoopStep), through Accelerator<>
// (BM_AcceleratorStep), and through the same features switched off at run time behind
// virtual calls and flags (BM_RuntimeDispatchStep), for a tiny model where bookkeeping
// dominates and for an MNIST-sized MLP. Run with --benchmark_enable_random_interleaving=true
// and repetitions so the sides alternate (bench/run_benchmarks.sh does).
//
// ACCELERATE_BENCH_DEVICE=cuda runs every side on the GPU (scripts/gpu-check.sh), each step
// ending with a device synchronisation.
//
//   bench_step --count-steps raw|accelerator N   run N tiny-model steps without Google
//                                                Benchmark, for instruction counts
//                                                (bench/instructions.sh)
#include <accelerate/accelerate.hpp>

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "mnist_mlp.hpp"

namespace {

struct TinyImpl : torch::nn::Module {
  TinyImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 16))), fc2(register_module("fc2", torch::nn::Linear(16, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Tiny);

using accelerate::bench::Mlp;

// The device the benchmarks run on: the CPU, or CUDA with ACCELERATE_BENCH_DEVICE=cuda.
torch::Device bench_device() {
  const char* device = std::getenv("ACCELERATE_BENCH_DEVICE");
  return device != nullptr && std::string(device) == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
}

// Waits for the device, so that a GPU step's time is its real time.
void finish_step() {
  if (bench_device().is_cuda()) torch::cuda::synchronize();
}

template <class Model> struct Shape;
template <> struct Shape<Tiny> {
  static constexpr int64_t in = 8, out = 4, batch = 16;
};
template <> struct Shape<Mlp> {
  static constexpr int64_t in = 784, out = 10, batch = 64;
};

template <class Model>
std::vector<torch::data::Example<>> make_batches() {
  torch::manual_seed(0);
  std::vector<torch::data::Example<>> batches;
  for (int i = 0; i < 16; ++i)
    batches.push_back({torch::randn({Shape<Model>::batch, Shape<Model>::in}).to(bench_device()),
                       torch::randint(0, Shape<Model>::out, {Shape<Model>::batch}).to(bench_device())});
  return batches;
}

// What every side starts from: the same initial weights, optimizer and batches.
template <class Model>
Model seeded_model() {
  torch::manual_seed(1);
  return Model{};
}

template <class Model>
struct Workload {
  Model net = seeded_model<Model>();
  torch::optim::SGD sgd{net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9)};
  const std::vector<torch::data::Example<>> batches = make_batches<Model>();

  const torch::data::Example<>& batch(std::size_t i) const { return batches[i % batches.size()]; }
};

// One step of each side, shared by the benchmarks and --count-steps.
template <class Net>
void raw_step(Net& net, torch::optim::Optimizer& opt, const torch::data::Example<>& batch) {
  opt.zero_grad();
  auto loss = torch::cross_entropy_loss(net(batch.data), batch.target);
  loss.backward();
  opt.step();
}

template <class Acc, class Model, class Opt>
void accelerator_step(Acc& acc, Model& model, Opt& opt, const torch::data::Example<>& batch) {
  auto step = acc.accumulate(model);
  opt.zero_grad();
  auto loss = torch::cross_entropy_loss(model(batch.data), batch.target);
  acc.backward(loss);
  opt.step();
}

template <class Model>
void BM_RawLoopStep(benchmark::State& state) {
  Workload<Model> w;
  w.net->to(bench_device());
  std::size_t i = 0;
  for (auto _ : state) {
    raw_step(w.net, w.sgd, w.batch(i++));
    finish_step();
  }
}

template <class Model>
void BM_AcceleratorStep(benchmark::State& state) {
  accelerate::Accelerator<> acc{{.cpu = bench_device().is_cpu()}};
  Workload<Model> w;
  auto [model, opt] = acc.prepare(w.net, w.sgd);
  std::size_t i = 0;
  for (auto _ : state) {
    accelerator_step(acc, model, opt, w.batch(i++));
    finish_step();
  }
}

// The same features decided at run time: what a design without compile-time policies pays.
// Every switch is off, exactly as in Accelerator<>, but each step asks for it.
class RuntimeFeatures {
 public:
  virtual ~RuntimeFeatures() = default;
  virtual bool accumulate() { return ++micro_ % steps_ == 0; }
  virtual torch::Tensor scale(const torch::Tensor& loss) { return fp16_ ? loss * scale_ : loss; }
  virtual void before_step(torch::optim::Optimizer& opt) {
    if (clip_ > 0) {
      std::vector<torch::Tensor> params;
      for (auto& g : opt.param_groups())
        for (auto& p : g.params()) params.push_back(p);
      torch::nn::utils::clip_grad_norm_(params, clip_);
    }
  }
  virtual bool autocast() const { return autocast_; }

  int steps_ = 1;
  bool fp16_ = false;
  bool autocast_ = false;
  double clip_ = 0;
  double scale_ = 1;
  long micro_ = 0;
};

template <class Model>
void BM_RuntimeDispatchStep(benchmark::State& state) {
  std::unique_ptr<RuntimeFeatures> features = std::make_unique<RuntimeFeatures>();
  Workload<Model> w;
  w.net->to(bench_device());
  std::size_t i = 0;
  for (auto _ : state) {
    const auto& [x, y] = w.batch(i++);
    const bool sync = features->accumulate();
    if (sync) w.sgd.zero_grad();
    torch::Tensor logits;
    if (features->autocast()) {
      accelerate::AutocastScope<accelerate::Bf16> scope(bench_device().type());
      logits = w.net(x).to(torch::kFloat);
    } else {
      logits = w.net(x);
    }
    auto loss = torch::cross_entropy_loss(logits, y);
    features->scale(loss / features->steps_).backward();
    if (sync) {
      features->before_step(w.sgd);
      w.sgd.step();
    }
    finish_step();
  }
}

// Accumulation over 4 micro-steps: each benchmark iteration is one micro-step.
template <class Model>
void BM_RawLoopAccumulate4(benchmark::State& state) {
  Workload<Model> w;
  w.net->to(bench_device());
  std::size_t i = 0;
  for (auto _ : state) {
    const auto& [x, y] = w.batch(i);
    (torch::cross_entropy_loss(w.net(x), y) / 4).backward();
    if (++i % 4 == 0) {
      w.sgd.step();
      w.sgd.zero_grad();
    }
    finish_step();
  }
}

template <class Model>
void BM_AcceleratorAccumulate4(benchmark::State& state) {
  accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::Accumulate<4>> acc{
      {.cpu = bench_device().is_cpu()}};
  Workload<Model> w;
  auto [model, opt] = acc.prepare(w.net, w.sgd);
  std::size_t i = 0;
  for (auto _ : state) {
    const auto& [x, y] = w.batch(i++);
    auto step = acc.accumulate(model);
    acc.backward(torch::cross_entropy_loss(model(x), y));
    opt.step();
    opt.zero_grad();
    finish_step();
  }
}

BENCHMARK(BM_RawLoopStep<Tiny>)->Name("BM_RawLoopStep/tiny");
BENCHMARK(BM_AcceleratorStep<Tiny>)->Name("BM_AcceleratorStep/tiny");
BENCHMARK(BM_RuntimeDispatchStep<Tiny>)->Name("BM_RuntimeDispatchStep/tiny");
BENCHMARK(BM_RawLoopStep<Mlp>)->Name("BM_RawLoopStep/mlp");
BENCHMARK(BM_AcceleratorStep<Mlp>)->Name("BM_AcceleratorStep/mlp");
BENCHMARK(BM_RuntimeDispatchStep<Mlp>)->Name("BM_RuntimeDispatchStep/mlp");
BENCHMARK(BM_RawLoopAccumulate4<Mlp>)->Name("BM_RawLoopAccumulate4/mlp");
BENCHMARK(BM_AcceleratorAccumulate4<Mlp>)->Name("BM_AcceleratorAccumulate4/mlp");

// N tiny-model steps of one side, for callgrind.
int count_steps(const std::string& side, long steps) {
  Workload<Tiny> w;
  if (side == "raw") {
    for (long i = 0; i < steps; ++i) raw_step(w.net, w.sgd, w.batch(static_cast<std::size_t>(i)));
    return 0;
  }
  if (side == "accelerator") {
    accelerate::Accelerator<> acc{{.cpu = true}};
    auto [model, opt] = acc.prepare(w.net, w.sgd);
    for (long i = 0; i < steps; ++i) accelerator_step(acc, model, opt, w.batch(static_cast<std::size_t>(i)));
    return 0;
  }
  std::cerr << "bench_step: --count-steps takes raw or accelerator\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);  // one intra-op thread: the comparison, not the machine, varies
  if (argc == 4 && std::strcmp(argv[1], "--count-steps") == 0) return count_steps(argv[2], std::atol(argv[3]));
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
