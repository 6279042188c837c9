// bench_loader: what reading data costs a training loop, and what workers buy back. A dataset
// of gzip'd greyscale images (28x28 by default, or a multiple of 28), each decoded (zlib) and
// reduced to 28x28 by averaging blocks per sample, feeds the MNIST MLP through a prepared DataLoader with 0, 1 and 2 workers; the
// reference is the same batches already decoded in memory (a prepared range of batches: the
// same loop without reading). Also the loader alone (no training) per worker count, to compare
// with torch's Python DataLoader on the same file (bench/python/loader_torch.py).
//
//   bench_loader --write FILE [--samples N] [--side S]   write the compressed SxS images
//   bench_loader --read FILE [--rounds R]       time every variant, round after round; one
//                                                JSON line per variant and round
//
// bench/loader.sh runs both sides and prints bench/README.md's table.
#include <accelerate/accelerate.hpp>

#include <torch/torch.h>
#include <zlib.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "mnist_mlp.hpp"

namespace {

constexpr std::size_t kBatch = 64;

using accelerate::bench::Mlp;

// File layout (little endian): uint64 count, uint32 side, then per image uint8 label, uint32
// length, bytes.
struct Images {
  int64_t side = 0;
  std::vector<std::vector<std::uint8_t>> blobs;
  std::vector<std::int64_t> labels;
};

void write_images(const std::string& path, std::size_t samples, std::uint32_t side) {
  torch::manual_seed(0);
  std::ofstream out(path, std::ios::binary);
  const std::uint64_t count = samples;
  out.write(reinterpret_cast<const char*>(&count), sizeof count);
  out.write(reinterpret_cast<const char*>(&side), sizeof side);
  const auto extent = static_cast<int64_t>(side);
  for (std::size_t i = 0; i < samples; ++i) {
    // Smooth shapes with noise, as photographs compress: a 28x28 pattern upsampled, plus grain.
    const auto coarse = torch::randint(0, 200, {1, 1, 28, 28}, torch::kFloat);
    auto image = torch::nn::functional::interpolate(
        coarse, torch::nn::functional::InterpolateFuncOptions().size(std::vector<int64_t>{extent, extent}).mode(torch::kBilinear).align_corners(false));
    image = (image + torch::randint(0, 24, image.sizes(), torch::kFloat)).clamp(0, 255).to(torch::kByte).contiguous();
    uLongf length = compressBound(static_cast<uLong>(image.numel()));
    std::vector<std::uint8_t> blob(length);
    if (compress2(blob.data(), &length, image.data_ptr<std::uint8_t>(), static_cast<uLong>(image.numel()), 6) != Z_OK)
      throw std::runtime_error("compress2 failed");
    const std::uint8_t label = static_cast<std::uint8_t>(i % 10);
    const auto size = static_cast<std::uint32_t>(length);
    out.write(reinterpret_cast<const char*>(&label), 1);
    out.write(reinterpret_cast<const char*>(&size), sizeof size);
    out.write(reinterpret_cast<const char*>(blob.data()), static_cast<std::streamsize>(length));
  }
}

Images read_images(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::uint64_t count = 0;
  std::uint32_t side = 0;
  in.read(reinterpret_cast<char*>(&count), sizeof count);
  in.read(reinterpret_cast<char*>(&side), sizeof side);
  Images images;
  images.side = side;
  for (std::uint64_t i = 0; i < count && in; ++i) {
    std::uint8_t label = 0;
    std::uint32_t size = 0;
    in.read(reinterpret_cast<char*>(&label), 1);
    in.read(reinterpret_cast<char*>(&size), sizeof size);
    std::vector<std::uint8_t> blob(size);
    in.read(reinterpret_cast<char*>(blob.data()), size);
    images.blobs.push_back(std::move(blob));
    images.labels.push_back(label);
  }
  if (images.blobs.size() != count) throw std::runtime_error(path + ": truncated");
  if (side == 0 || side % 28 != 0) throw std::runtime_error(path + ": the image side must be a multiple of 28");
  return images;
}

// The map-style dataset: decode, scale to [0, 1], average down to 28x28. Read-only, so safe
// to call from several workers at once.
struct GzipImages {
  std::shared_ptr<const Images> images;
  std::size_t size() const { return images->blobs.size(); }
  torch::data::Example<> get(std::size_t i) const {
    const int64_t side = images->side;
    std::vector<std::uint8_t> pixels(static_cast<std::size_t>(side * side));
    uLongf length = static_cast<uLongf>(pixels.size());
    const auto& blob = images->blobs[i];
    if (uncompress(pixels.data(), &length, blob.data(), static_cast<uLong>(blob.size())) != Z_OK ||
        length != pixels.size())
      throw std::runtime_error("image " + std::to_string(i) + " does not decode");
    // Average f x f blocks into the 28x28 input, scaled to [0, 1]: one tensor per sample.
    const int64_t f = side / 28;
    torch::Tensor image = torch::empty({784}, torch::kFloat);
    float* out = image.data_ptr<float>();
    for (int64_t y = 0; y < 28; ++y)
      for (int64_t x = 0; x < 28; ++x) {
        int sum = 0;
        for (int64_t dy = 0; dy < f; ++dy)
          for (int64_t dx = 0; dx < f; ++dx) sum += pixels[static_cast<std::size_t>((y * f + dy) * side + x * f + dx)];
        out[y * 28 + x] = static_cast<float>(sum) / static_cast<float>(255 * f * f);
      }
    return {image, torch::tensor(images->labels[i])};
  }
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// One epoch of training on `data` (a DataLoader or a range of batches): microseconds per step.
template <class Acc, class Data>
double train_epoch(Acc& acc, Data data) {
  torch::manual_seed(1);
  Mlp net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto [model, opt, loader] = acc.prepare(net, sgd, std::move(data));
  std::size_t steps = 0;
  const auto start = Clock::now();
  for (auto& [x, y] : loader) {
    opt.zero_grad();
    acc.backward(torch::cross_entropy_loss(model(x), y));
    opt.step();
    ++steps;
  }
  return 1e6 * seconds_since(start) / static_cast<double>(steps);
}

// The loader alone: samples per second over one epoch.
template <class Acc>
double read_epoch(Acc& acc, const GzipImages& dataset, std::size_t workers) {
  auto [loader] = acc.prepare(accelerate::DataLoader(dataset, {.batch_size = kBatch, .num_workers = workers}));
  std::size_t samples = 0;
  const auto start = Clock::now();
  for (auto& [x, y] : loader) samples += static_cast<std::size_t>(x.size(0));
  return static_cast<double>(samples) / seconds_since(start);
}

int run(const std::string& path, int rounds) {
  at::set_num_threads(1);  // one intra-op thread, as every benchmark here; workers inherit it
  const GzipImages dataset{std::make_shared<const Images>(read_images(path))};
  accelerate::Accelerator<> acc{{.cpu = true}};

  std::vector<torch::data::Example<>> in_memory;  // the batches a 0-worker loader yields
  {
    auto [loader] = acc.prepare(accelerate::DataLoader(dataset, {.batch_size = kBatch}));
    for (auto& batch : loader) in_memory.push_back(batch);
  }
  for (int round = 0; round < rounds; ++round) {
    auto line = [&](const std::string& variant, const char* unit, double value) {
      std::cout << "{\"side\":\"accelerate-cpp\",\"round\":" << round << ",\"variant\":\"" << variant << "\",\"" << unit
                << "\":" << value << "}" << std::endl;
    };
    line("in_memory", "us_per_step", train_epoch(acc, in_memory));
    for (const std::size_t workers : {0u, 1u, 2u})
      line("workers_" + std::to_string(workers), "us_per_step",
           train_epoch(acc, accelerate::DataLoader(dataset, {.batch_size = kBatch, .num_workers = workers})));
    for (const std::size_t workers : {0u, 1u, 2u})
      line("loader_only_workers_" + std::to_string(workers), "samples_per_s", read_epoch(acc, dataset, workers));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string write, read;
  std::size_t samples = 9600;
  std::uint32_t side = 28;
  int rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--write") write = value;
    else if (flag == "--read") read = value;
    else if (flag == "--samples") samples = std::stoul(value);
    else if (flag == "--side") side = static_cast<std::uint32_t>(std::stoul(value));
    else if (flag == "--rounds") rounds = std::stoi(value);
  }
  if (!write.empty()) {
    write_images(write, samples, side);
    return 0;
  }
  if (read.empty()) {
    std::cerr << "usage: bench_loader --write FILE [--samples N] [--side S] | --read FILE [--rounds R]\n";
    return 2;
  }
  return run(read, rounds);
}
