// bench_checkpoint: save_state/load_state throughput next to a plain sequential write/read of
// the same number of bytes (write + fsync, read into memory), for a model of ~100 MB with
// Adam (its two moments triple the bytes: ~300 MB of training state). MB/s is reported as
// bytes_per_second. Asynchronous saves are timed twice: the time save_state blocks the
// training loop, and the time until the background writer has published the checkpoint.
#include <accelerate/accelerate.hpp>

#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "large_model.hpp"

namespace {

using accelerate::bench::Large;

std::filesystem::path scratch() {
  const char* dir = std::getenv("ACCELERATE_BENCH_DIR");
  return std::filesystem::path(dir ? dir : std::filesystem::temp_directory_path().string()) / "accelerate-bench-checkpoint";
}

// A trained-once accelerator whose state is ~3x the model's bytes (weights + Adam moments).
struct Setup {
  accelerate::Accelerator<> acc{{.cpu = true, .seed = 0}};
  Large net;
  torch::optim::Adam adam{net->parameters()};
  Setup() {
    auto [model, opt] = acc.prepare(net, adam);
    acc.backward(model(torch::randn({2, 2048})).sum());
    opt.step();
  }
  int64_t state_bytes() const {
    int64_t bytes = 0;
    for (const auto& p : net->parameters()) bytes += 3 * p.numel() * 4;
    return bytes;
  }
};

void BM_SaveState(benchmark::State& state) {
  Setup s;
  for (auto _ : state) s.acc.save_state(scratch() / "state");
  state.SetBytesProcessed(state.iterations() * s.state_bytes());
}

// What an asynchronous save costs the training loop: save_state returns once the state is
// copied to host memory; the wait for the writer is outside the timing.
void BM_SaveStateAsyncBlocking(benchmark::State& state) {
  Setup s;
  for (auto _ : state) {
    s.acc.save_state(scratch() / "state", {.asynchronous = true});
    state.PauseTiming();
    s.acc.wait_for_save();
    state.ResumeTiming();
  }
  state.SetBytesProcessed(state.iterations() * s.state_bytes());
}

// The background writer's bandwidth: from the call until the checkpoint is published.
void BM_SaveStateAsyncWritten(benchmark::State& state) {
  Setup s;
  for (auto _ : state) {
    s.acc.save_state(scratch() / "state", {.asynchronous = true});
    s.acc.wait_for_save();
  }
  state.SetBytesProcessed(state.iterations() * s.state_bytes());
}

void BM_LoadState(benchmark::State& state) {
  Setup s;
  s.acc.save_state(scratch() / "state");
  for (auto _ : state) s.acc.load_state(scratch() / "state");
  state.SetBytesProcessed(state.iterations() * s.state_bytes());
}

// Without comparing checksums (LoadStateOptions::verify_checksums = false).
void BM_LoadStateUnverified(benchmark::State& state) {
  Setup s;
  s.acc.save_state(scratch() / "state");
  for (auto _ : state) s.acc.load_state(scratch() / "state", {.verify_checksums = false});
  state.SetBytesProcessed(state.iterations() * s.state_bytes());
}

void BM_PlainWrite(benchmark::State& state) {
  const int64_t bytes = Setup().state_bytes();
  std::vector<char> buffer(static_cast<std::size_t>(bytes), 1);
  std::filesystem::create_directories(scratch());
  const auto path = scratch() / "plain.bin";
  for (auto _ : state) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::size_t done = 0;
    while (done < buffer.size()) done += static_cast<std::size_t>(::write(fd, buffer.data() + done, buffer.size() - done));
    ::fsync(fd);
    ::close(fd);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

void BM_PlainRead(benchmark::State& state) {
  const int64_t bytes = Setup().state_bytes();
  std::vector<char> buffer(static_cast<std::size_t>(bytes), 1);
  std::filesystem::create_directories(scratch());
  const auto path = scratch() / "plain.bin";
  {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::size_t done = 0;
    while (done < buffer.size()) done += static_cast<std::size_t>(::write(fd, buffer.data() + done, buffer.size() - done));
    ::close(fd);
  }
  for (auto _ : state) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    std::size_t done = 0;
    while (done < buffer.size()) done += static_cast<std::size_t>(::read(fd, buffer.data() + done, buffer.size() - done));
    ::close(fd);
    benchmark::DoNotOptimize(buffer.data());
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

BENCHMARK(BM_SaveState)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_SaveStateAsyncBlocking)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_SaveStateAsyncWritten)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_PlainWrite)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_LoadState)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_LoadStateUnverified)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_PlainRead)->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ec;
  std::filesystem::remove_all(scratch(), ec);
  return 0;
}
