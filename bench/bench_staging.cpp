// bench_staging: what moving batches from host memory to a CUDA device costs a training step,
// by how the copy is made. The same host batches (image-sized: 256 x 3x128x128 floats, 50 MB)
// feed the same model on the GPU, side by side, round after round:
//   resident          the batches already on the device (no copy: the floor)
//   pageable          Tensor::to(device): a blocking copy from pageable memory
//   pinned_per_batch  pin_memory() per batch, then a non_blocking copy on the compute stream
//                     (what the prepared loader did before DeviceStager)
//   staged            data::DeviceStager: reused page-locked buffers, copies on a side stream
//   prepared_loader   a prepared range of the host batches (staged, as a user's loop gets them)
// The step does not wait for the GPU (no .item()), so the host runs ahead as a training loop
// does, and a copy on a side stream can run under the previous step's kernels.
//
//   bench_staging [--rounds R] [--steps N]     one JSON line per variant and round
// Needs a CUDA device; without one it says so and exits 77.
#include <accelerate/accelerate.hpp>

#include <ATen/core/CachingHostAllocator.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr int64_t kBatch = 256;
constexpr int64_t kFeatures = 3 * 128 * 128;
constexpr int64_t kClasses = 10;
constexpr int kDistinctBatches = 4;

using Batch = std::pair<at::Tensor, at::Tensor>;

struct Model : torch::nn::Module {
  Model()
      : fc1(register_module("fc1", torch::nn::Linear(kFeatures, 1024))),
        fc2(register_module("fc2", torch::nn::Linear(1024, kClasses))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};

int64_t pinned_requests() {
  return at::getHostAllocator(at::kCUDA)->get_stats().active_requests.allocated;
}

struct Result {
  double ms_per_step;
  double pinned_requests_per_step;
};

/// `steps` training steps on the batches `next(k)` gives, after 5 untimed ones; the time runs
/// until the GPU has finished.
Result run(Model& model, torch::optim::SGD& sgd, int steps, const std::function<Batch(int)>& next) {
  const auto step = [&](int k) {
    auto [x, y] = next(k);
    sgd.zero_grad();
    torch::nn::functional::cross_entropy(model.forward(x), y).backward();
    sgd.step();
  };
  for (int k = 0; k < 5; ++k) step(k);
  torch::cuda::synchronize();
  const auto requests = pinned_requests();
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < steps; ++k) step(k);
  torch::cuda::synchronize();
  const std::chrono::duration<double, std::milli> elapsed = std::chrono::steady_clock::now() - start;
  return {elapsed.count() / steps, static_cast<double>(pinned_requests() - requests) / steps};
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3;
  int steps = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--rounds") rounds = std::stoi(argv[i + 1]);
    else if (flag == "--steps") steps = std::stoi(argv[i + 1]);
    else {
      std::cerr << "unknown flag " << flag << '\n';
      return 2;
    }
  }
  if (!torch::cuda::is_available()) {
    std::cerr << "bench_staging: no CUDA device\n";
    return 77;
  }
  const c10::Device cuda(c10::kCUDA, 0);
  torch::manual_seed(0);
  std::vector<Batch> host, resident;
  for (int k = 0; k < kDistinctBatches; ++k) {
    host.emplace_back(torch::randn({kBatch, kFeatures}), torch::randint(0, kClasses, {kBatch}));
    resident.emplace_back(host.back().first.to(cuda), host.back().second.to(cuda));
  }
  Model model;
  model.to(cuda);
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));

  accelerate::Accelerator<> acc;
  std::vector<Batch> host_range;  // enough batches for one loop over the prepared range
  for (int k = 0; k < steps + 5; ++k) host_range.push_back(host[k % kDistinctBatches]);
  auto [loader] = acc.prepare(host_range);
  accelerate::data::DeviceStager<> stager(accelerate::data::StreamTransfer{cuda});

  const std::vector<std::pair<std::string, std::function<Result()>>> variants{
      {"resident", [&] { return run(model, sgd, steps, [&](int k) { return resident[k % kDistinctBatches]; }); }},
      {"pageable", [&] {
         return run(model, sgd, steps, [&](int k) {
           const auto& [x, y] = host[k % kDistinctBatches];
           return Batch{x.to(cuda), y.to(cuda)};
         });
       }},
      {"pinned_per_batch", [&] {
         return run(model, sgd, steps, [&](int k) {
           return accelerate::data::to_device(host[k % kDistinctBatches], cuda, /*non_blocking=*/true);
         });
       }},
      {"staged", [&] { return run(model, sgd, steps, [&](int k) { return stager.stage(host[k % kDistinctBatches]); }); }},
      {"prepared_loader", [&] {
         auto it = loader.begin();
         return run(model, sgd, steps, [&](int) {
           Batch batch = *it;
           ++it;
           return batch;
         });
       }},
  };
  for (int round = 0; round < rounds; ++round) {
    for (const auto& [name, measure] : variants) {
      const auto result = measure();
      std::cout << "{\"bench\": \"staging\", \"variant\": \"" << name << "\", \"round\": " << round
                << ", \"batch_mb\": " << static_cast<double>(kBatch * kFeatures * 4) / 1e6
                << ", \"ms_per_step\": " << result.ms_per_step
                << ", \"pinned_requests_per_step\": " << result.pinned_requests_per_step << "}" << std::endl;
    }
  }
  return 0;
}
