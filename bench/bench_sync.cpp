// bench_sync: the price of gradient synchronisation on 2 ranks over Gloo (it starts them
// itself; --nproc N for another count). For a ~10M-parameter MLP:
//   BM_FlatAllreduce             backward, then one all-reduce of all gradients (the floor a
//                                hand-written loop gets without overlap)
//   BM_BucketedReducer/<MB>      the Accelerator's reducer: buckets of <MB> all-reduced from
//                                autograd hooks while backward runs (gradients as bucket views)
//   BM_GradientCopies/4          the same with DdpOptions::gradient_as_bucket_view off: each
//                                gradient copied into its bucket and the average copied back
//   BM_BucketViewsZeroed/4       views, and zero_grad(false): the views are kept, nothing is
//                                copied at all
//   BM_ReversedOrder/registration|arrival  a model registered in the reverse of its run order,
//                                buckets in registration order or rebuilt in arrival order
//   BM_Compression/fp16|bf16|power_sgd  compressed buckets (PowerSGD rank 4, from the start)
//   BM_SumOrder/ring|rank_order  DdpOptions::sum_in_rank_order off (Gloo's ring all-reduce)
//                                and on (all-to-all reduce-scatter, then all-gather); the two
//                                differ from 3 ranks on (--nproc 3), on 2 both are the ring
//   BM_Accumulate8/no_sync       8 micro-steps per optimizer step, communicating once
//   BM_Accumulate8/sync_every    the same 8 micro-steps, all-reducing every one
// Counters: comm_MB per optimizer step (this rank's payload), gradient_MB (the gradients'
// memory after backward: buckets and .grad), comm_ms and exposed_ms per step (collectives in
// flight, and the part the training thread waited for). Every rank runs the same fixed
// iteration counts in lockstep; the sides alternate, round after round, in one run.
#include <accelerate/accelerate.hpp>

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;

constexpr int kIterations = 12;
constexpr int kRounds = 3;

// ~9.5M parameters in ten 4 MB layers, so that the bucket cap decides how many all-reduces a
// backward pass issues and how early the first one starts. `registered_last_first` registers
// the same layers (same initial weights) output first: reverse registration order, the initial
// bucket order, is then the reverse of the order backward produces gradients in.
struct BigMlpImpl : torch::nn::Module {
  explicit BigMlpImpl(bool registered_last_first = false) {
    for (int i = 0; i < 9; ++i) hidden.emplace_back(1024, 1024);
    out = torch::nn::Linear(1024, 10);
    if (registered_last_first) register_module("out", out);
    for (int k = 0; k < 9; ++k) {
      const int i = registered_last_first ? 8 - k : k;
      register_module("hidden" + std::to_string(i), hidden[static_cast<std::size_t>(i)]);
    }
    if (!registered_last_first) register_module("out", out);
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& layer : hidden) x = torch::relu(layer(x));
    return out(x);
  }
  std::vector<torch::nn::Linear> hidden;
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(BigMlp);

struct Batch {
  torch::Tensor x = torch::randn({64, 1024});
  torch::Tensor y = torch::randint(0, 10, {64});
};

double megabytes(uint64_t bytes) { return static_cast<double>(bytes) / 1e6; }

// Trains `net` with `ddp` for the benchmark's iterations and sets the counters.
template <class Net>
void train_with(benchmark::State& state, Net& net, accelerate::DdpOptions ddp, bool set_to_none = true) {
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 120s}, .ddp = ddp}};
  torch::optim::SGD sgd(net->parameters(), 0.001);
  auto [model, opt] = acc.prepare(net, sgd);
  const Batch batch;
  auto* reducer = model.model_sync().reducer();
  // One step first: buckets rebuilt in arrival order, PowerSGD's state allocated.
  opt.zero_grad(set_to_none);
  acc.backward(torch::cross_entropy_loss(model(batch.x), batch.y));
  const double gradient_mb = reducer ? megabytes(reducer->gradient_memory_bytes()) : 0;
  opt.step();
  const auto before = acc.stats();
  for (auto _ : state) {
    opt.zero_grad(set_to_none);
    acc.backward(torch::cross_entropy_loss(model(batch.x), batch.y));
    opt.step();
  }
  const auto after = acc.stats();
  const double steps = static_cast<double>(state.iterations());
  state.counters["comm_MB"] = megabytes(after.gradient_allreduce.bytes - before.gradient_allreduce.bytes) / steps;
  state.counters["gradient_MB"] = gradient_mb;
  state.counters["comm_ms"] = 1e3 * (after.time.busy_seconds - before.time.busy_seconds) / steps;
  state.counters["exposed_ms"] = 1e3 * (after.time.exposed_seconds - before.time.exposed_seconds) / steps;
  state.counters["buckets"] = static_cast<double>(reducer ? reducer->bucket_count() : 0);
  state.counters["rank_order"] = reducer && reducer->sums_in_rank_order() ? 1 : 0;
  state.counters["overlapped_launches"] = static_cast<double>(reducer ? reducer->overlapped_launches() : 0) / (steps + 1);
}

void BM_FlatAllreduce(benchmark::State& state) {
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 120s}}};
  BigMlp net;
  torch::optim::SGD opt(net->parameters(), 0.001);
  auto* comm = acc.engine().communicator();
  const Batch batch;
  const auto before = acc.stats().allreduce.bytes;
  for (auto _ : state) {
    opt.zero_grad();
    torch::cross_entropy_loss(net(batch.x), batch.y).backward();
    std::vector<torch::Tensor> grads;
    for (auto& p : net->parameters()) grads.push_back(p.grad().reshape(-1));
    auto flat = torch::cat(grads);
    if (comm != nullptr) comm->all_reduce(flat, accelerate::Reduction::mean);
    int64_t offset = 0;
    for (auto& p : net->parameters()) {
      p.mutable_grad().copy_(flat.narrow(0, offset, p.numel()).view_as(p));
      offset += p.numel();
    }
    opt.step();
  }
  state.counters["comm_MB"] = megabytes(acc.stats().allreduce.bytes - before) / state.iterations();
}

void BM_BucketedReducer(benchmark::State& state) {
  const auto cap = static_cast<std::size_t>(state.range(0)) << 20;
  BigMlp net;
  train_with(state, net, {.bucket_cap_bytes = cap, .first_bucket_cap_bytes = std::min(cap, std::size_t{1} << 20)});
}

void BM_GradientCopies(benchmark::State& state) {
  BigMlp net;
  train_with(state, net, {.gradient_as_bucket_view = false});
}

void BM_BucketViewsZeroed(benchmark::State& state) {
  BigMlp net;
  train_with(state, net, {}, /*set_to_none=*/false);
}

void BM_ReversedOrder(benchmark::State& state) {
  BigMlp net(/*registered_last_first=*/true);
  train_with(state, net, {.bucket_order_from_arrival = state.range(0) == 1});
}

void BM_Compression(benchmark::State& state) {
  BigMlp net;
  accelerate::DdpOptions ddp{.compression = static_cast<accelerate::GradientCompression>(state.range(0))};
  ddp.power_sgd = {.rank = 4, .start_iteration = 0};
  train_with(state, net, ddp);
}

void BM_SumOrder(benchmark::State& state) {
  BigMlp net;
  train_with(state, net, {.sum_in_rank_order = state.range(0) == 1});
}

void BM_Accumulate8(benchmark::State& state) {
  const bool sync_every = state.range(0) == 1;
  using Acc = accelerate::Accelerator<accelerate::Gloo, accelerate::Fp32, accelerate::Accumulate<8>>;
  Acc acc{{.process_group = {.timeout = 120s}}};
  BigMlp net;
  torch::optim::SGD sgd(net->parameters(), 0.001);
  auto [model, opt] = acc.prepare(net, sgd);
  const Batch batch;
  for (auto _ : state) {  // one optimizer step = 8 micro-steps
    for (int micro = 0; micro < 8; ++micro) {
      auto step = acc.accumulate(model);
      if (sync_every) model.model_sync().set_sync(true);  // what forgetting no_sync costs
      acc.backward(torch::cross_entropy_loss(model(batch.x), batch.y));
      opt.step();
      opt.zero_grad();
    }
  }
  state.counters["comm_MB"] = megabytes(acc.stats().gradient_allreduce.bytes) / state.iterations();
}

void register_benchmarks() {
  for (int round = 0; round < kRounds; ++round) {
    benchmark::RegisterBenchmark("BM_FlatAllreduce", BM_FlatAllreduce)->Iterations(kIterations)->Unit(benchmark::kMillisecond);
    for (int mb : {1, 4, 25, 100})
      benchmark::RegisterBenchmark("BM_BucketedReducer", BM_BucketedReducer)
          ->Arg(mb)->Iterations(kIterations)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_GradientCopies/4", BM_GradientCopies)->Iterations(kIterations)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_BucketViewsZeroed/4", BM_BucketViewsZeroed)->Iterations(kIterations)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_ReversedOrder/registration", BM_ReversedOrder)->Arg(0)->Iterations(kIterations)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_ReversedOrder/arrival", BM_ReversedOrder)->Arg(1)->Iterations(kIterations)->Unit(benchmark::kMillisecond);
    for (auto c : {accelerate::GradientCompression::fp16, accelerate::GradientCompression::bf16,
                   accelerate::GradientCompression::power_sgd})
      benchmark::RegisterBenchmark((std::string("BM_Compression/") + accelerate::to_string(c)).c_str(), BM_Compression)
          ->Arg(static_cast<int>(c))->Iterations(kIterations)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_SumOrder/ring", BM_SumOrder)->Arg(0)->Iterations(kIterations)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_SumOrder/rank_order", BM_SumOrder)->Arg(1)->Iterations(kIterations)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_Accumulate8/no_sync", BM_Accumulate8)->Arg(0)->Iterations(kIterations / 3)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_Accumulate8/sync_every", BM_Accumulate8)->Arg(1)->Iterations(kIterations / 3)->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  ::setenv("ACCELERATE_NUM_PROCESSES", "2", /*overwrite=*/0);
  return accelerate::launch(argc, argv, [](int argc, char** argv) {
    torch::set_num_threads(1);
    const char* rank = std::getenv("RANK");
    const bool reporting = rank == nullptr || std::string(rank) == "0";
    std::vector<char*> args(argv, argv + argc);
    if (!reporting) {  // other ranks run the same benchmarks in lockstep, silently, writing no file
      std::erase_if(args, [](const char* a) { return std::string(a).rfind("--benchmark_out", 0) == 0; });
    }
    int count = static_cast<int>(args.size());
    args.push_back(nullptr);
    benchmark::Initialize(&count, args.data());
    register_benchmarks();
    if (reporting) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      struct Silent : benchmark::BenchmarkReporter {
        bool ReportContext(const Context&) override { return true; }
        void ReportRuns(const std::vector<Run>&) override {}
      } silent;
      benchmark::RunSpecifiedBenchmarks(&silent);
    }
    benchmark::Shutdown();
    return 0;
  });
}
