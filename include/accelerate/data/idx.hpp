// Reader for gzip'd IDX files (the MNIST family's format) and the Fashion-MNIST splits.
// Optional: not in the umbrella header; the Fashion-MNIST example includes it.
#pragma once

#ifndef ACCELERATE_IDX_WITHOUT_ZLIB
#include <zlib.h>
#else
#include <cstdio>
#endif

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <accelerate/data/tensor_dataset.hpp>
#include <accelerate/detail/check.hpp>

namespace accelerate::data {

/// Default location of the Debian package `dataset-fashion-mnist`.
inline const std::filesystem::path fashion_mnist_default_dir = "/usr/share/datasets/fashion-mnist";

/// Reads a gzip'd IDX file of unsigned bytes (magic 0x0000080N) into a uint8 tensor of the
/// dimensions the header gives. Errors name the file and what is wrong with it.
inline at::Tensor read_idx(const std::filesystem::path& path) {
  ACCELERATE_CHECK(std::filesystem::exists(path), "read_idx: ", path.string(),
                   ": no such file");
#ifndef ACCELERATE_IDX_WITHOUT_ZLIB
  gzFile file = gzopen(path.c_str(), "rb");
  ACCELERATE_CHECK(file != nullptr, "read_idx: ", path.string(), ": cannot open");
  struct Closer {
    gzFile f;
    ~Closer() { gzclose(f); }
  } closer{file};
  auto read_some = [&](void* out, unsigned bytes) { return gzread(file, out, bytes); };
#else
  // Built without zlib: decompress through gzip(1). The path is quoted for the shell.
  std::string quoted = "'";
  for (const char c : path.string()) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  FILE* file = ::popen(("gzip -dc " + quoted).c_str(), "r");
  ACCELERATE_CHECK(file != nullptr, "read_idx: ", path.string(), ": cannot run gzip -dc");
  struct Closer {
    FILE* f;
    ~Closer() { ::pclose(f); }
  } closer{file};
  auto read_some = [&](void* out, unsigned bytes) { return static_cast<int>(std::fread(out, 1, bytes, file)); };
#endif
  auto read_exact = [&](void* out, unsigned bytes, const char* what) {
    const int got = read_some(out, bytes);
    ACCELERATE_CHECK(got == static_cast<int>(bytes), "read_idx: ", path.string(),
                     ": truncated while reading the ", what, " (wanted ", bytes, " bytes, got ",
                     got, ")");
  };
  std::array<unsigned char, 4> magic{};
  read_exact(magic.data(), 4, "magic number");
  ACCELERATE_CHECK(magic[0] == 0 && magic[1] == 0 && magic[2] == 0x08 && magic[3] >= 1 &&
                       magic[3] <= 4,
                   "read_idx: ", path.string(),
                   ": not an IDX file of unsigned bytes (magic must be 00 00 08 0N)");
  std::vector<int64_t> dims;
  int64_t total = 1;
  for (int d = 0; d < magic[3]; ++d) {
    std::array<unsigned char, 4> be{};
    read_exact(be.data(), 4, "dimension sizes");
    const int64_t size = (int64_t{be[0]} << 24) | (int64_t{be[1]} << 16) | (int64_t{be[2]} << 8) |
                         int64_t{be[3]};
    ACCELERATE_CHECK(size > 0 && size < (int64_t{1} << 28), "read_idx: ", path.string(),
                     ": implausible dimension ", size);
    dims.push_back(size);
    total *= size;
  }
  ACCELERATE_CHECK(total < (int64_t{1} << 32), "read_idx: ", path.string(), ": too large");
  at::Tensor out = at::empty(dims, at::kByte);
  read_exact(out.data_ptr(), static_cast<unsigned>(total), "data");
  return out;
}

/// The Fashion-MNIST train or test split as a TensorDataset: images as float [N, 784] scaled to
/// [0, 1] and normalised with the training set's mean and standard deviation, labels as int64.
/// A missing folder is an error naming the Debian package that provides it.
/// Example:
///   auto train = accelerate::data::load_fashion_mnist(accelerate::data::fashion_mnist_default_dir, true);
inline TensorDataset load_fashion_mnist(const std::filesystem::path& dir, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  const auto images_path = dir / (prefix + "-images-idx3-ubyte.gz");
  const auto labels_path = dir / (prefix + "-labels-idx1-ubyte.gz");
  ACCELERATE_CHECK(std::filesystem::exists(images_path) && std::filesystem::exists(labels_path),
                   "Fashion-MNIST not found: ", images_path.string(), " and ", labels_path.string(),
                   " are needed. Install the Debian package dataset-fashion-mnist "
                   "(apt-get install dataset-fashion-mnist) or pass --data DIR");
  const at::Tensor images = read_idx(images_path);
  const at::Tensor labels = read_idx(labels_path);
  ACCELERATE_CHECK(images.dim() == 3 && labels.dim() == 1 && images.size(0) == labels.size(0),
                   "Fashion-MNIST: ", images_path.string(), " has shape ", images.sizes(), " but ",
                   labels_path.string(), " has shape ", labels.sizes(),
                   " (expected [N, 28, 28] and [N])");
  // A label outside the 10 classes would reach the loss as an out-of-range index (an uncaught
  // c10::IndexError); name the record instead.
  const at::Tensor out_of_range = (labels.to(at::kLong) > 9).nonzero();
  ACCELERATE_CHECK(out_of_range.numel() == 0, "Fashion-MNIST: ", labels_path.string(), ": record ",
                   out_of_range.numel() ? out_of_range[0][0].item<int64_t>() : 0, " has label ",
                   out_of_range.numel() ? labels[out_of_range[0][0].item<int64_t>()].item<int64_t>() : 0,
                   ", outside the classes 0..9 (a corrupt file?)");
  constexpr double mean = 0.2860, stddev = 0.3530;  // of the training images scaled to [0, 1]
  at::Tensor x = images.reshape({images.size(0), -1}).to(at::kFloat).div_(255.0);
  x.sub_(mean).div_(stddev);
  return TensorDataset(std::move(x), labels.to(at::kLong));
}

}  // namespace accelerate::data
