// libFuzzer target for the readers of untrusted files: SafetensorsFile::open (and reading every
// tensor it describes) and read_model_index. Built with clang's ASan and UBSan; any crash,
// sanitizer report or exception other than accelerate::Error is a finding.
#include <accelerate/checkpoint/safetensors.hpp>
#include <accelerate/checkpoint/sharding.hpp>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>

namespace {

std::filesystem::path scratch_file(const char* name) {
  static const std::filesystem::path dir = [] {
    std::string pattern = (std::filesystem::temp_directory_path() / "accelerate-fuzz-XXXXXX").string();
    return std::filesystem::path(::mkdtemp(pattern.data()));
  }();
  return dir / name;
}

void write(const std::filesystem::path& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto tensors = scratch_file("input.safetensors");
  write(tensors, data, size);
  try {
    const auto file = accelerate::checkpoint::SafetensorsFile::open(tensors);
    for (const auto& name : file.names()) {
      const auto t = file.tensor(name);
      if (t.numel() > 0) {
        (void)t.reshape(-1)[t.numel() - 1].item();  // touch the last element
        t.reshape(-1)[0].zero_();                   // tensors handed out are writable
      }
    }
  } catch (const accelerate::Error&) {
  }
  const auto index = scratch_file("model.safetensors.index.json");
  write(index, data, size);
  try {
    (void)accelerate::checkpoint::read_model_index(index);
  } catch (const accelerate::Error&) {
  }
  return 0;
}
