// Bodies of tensorboard.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/track/tensorboard.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE std::uint32_t crc32c(const char* data, std::size_t size) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ static_cast<unsigned char>(data[i])) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

ACCELERATE_INLINE void varint(std::string& out, std::uint64_t value) {
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7F) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
}

ACCELERATE_INLINE void bytes_field(std::string& out, int field, const std::string& bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}

ACCELERATE_INLINE std::string event(double wall_time, std::int64_t step, int what_field, const std::string& what) {
  std::string out;
  key(out, 1, 1);
  fixed(out, wall_time);
  key(out, 2, 0);
  varint(out, static_cast<std::uint64_t>(step));
  bytes_field(out, what_field, what);
  return out;
}

ACCELERATE_INLINE std::string scalar_summary(const Metrics& values) {
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string v;
    bytes_field(v, 1, tag);
    key(v, 2, 5);
    fixed(v, static_cast<float>(value));
    bytes_field(summary, 1, v);
  }
  return summary;
}

}  // namespace accelerate::detail

namespace accelerate {

ACCELERATE_INLINE void TensorBoardTracker::start(const std::string& project, const nlohmann::json& config) {
  const auto folder = dir_ / project;
  std::filesystem::create_directories(folder);
  std::ofstream(folder / "config.json") << config.dump(2) << '\n';
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const auto seconds = static_cast<long long>(now());
  path_ = folder / ("events.out.tfevents." + std::to_string(seconds) + "." + host);
  out_.open(path_, std::ios::binary | std::ios::app);
  ACCELERATE_CHECK(out_.good(), "TensorBoardTracker: cannot write ", path_.string());
  record(detail::event(now(), 0, 3, "brain.Event:2"));
}

ACCELERATE_INLINE void TensorBoardTracker::record(const std::string& data) {
  std::string header;
  detail::fixed(header, static_cast<std::uint64_t>(data.size()));
  std::string framed = header;
  detail::fixed(framed, detail::masked_crc32c(header.data(), header.size()));
  framed += data;
  detail::fixed(framed, detail::masked_crc32c(data.data(), data.size()));
  out_.write(framed.data(), static_cast<std::streamsize>(framed.size()));
  out_.flush();
  ACCELERATE_CHECK(out_.good(), "TensorBoardTracker: writing ", path_.string(), " failed");
}

}  // namespace accelerate
