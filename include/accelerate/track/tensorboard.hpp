// TensorBoardTracker: scalar summaries in TensorBoard's event-file format (TFRecord framing
// with masked CRC32C, Event/Summary protocol buffers encoded by hand), readable by
// TensorBoard itself without TensorFlow or protobuf here.
#pragma once

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include <accelerate/detail/check.hpp>
#include <accelerate/track/tracker.hpp>

namespace accelerate {

namespace detail {

/// CRC-32C (Castagnoli), as TFRecord uses.
inline std::uint32_t crc32c(const char* data, std::size_t size) {
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

/// TFRecord's masked CRC: rotated and offset so that CRCs of CRCs do not collide.
inline std::uint32_t masked_crc32c(const char* data, std::size_t size) {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

// Protocol buffer wire format, just what Event and Summary need.
inline void varint(std::string& out, std::uint64_t value) {
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7F) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
}
inline void key(std::string& out, int field, int wire_type) { varint(out, static_cast<std::uint64_t>(field << 3 | wire_type)); }
inline void bytes_field(std::string& out, int field, const std::string& bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}
template <class T>
void fixed(std::string& out, T value) {
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));  // little-endian hosts, as TFRecord
  out.append(raw, sizeof(T));
}

/// An Event: wall_time (1, double), step (2, int64), and file_version (3) or summary (5).
inline std::string event(double wall_time, std::int64_t step, int what_field, const std::string& what) {
  std::string out;
  key(out, 1, 1);
  fixed(out, wall_time);
  key(out, 2, 0);
  varint(out, static_cast<std::uint64_t>(step));
  bytes_field(out, what_field, what);
  return out;
}

/// A Summary with one Value per metric: tag (1, string), simple_value (2, float).
inline std::string scalar_summary(const Metrics& values) {
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

}  // namespace detail

/// Writes `<dir>/<project>/events.out.tfevents.<time>.<host>` (plus config.json): open it
/// with `tensorboard --logdir <dir>`.
/// Example:
///   acc.add_tracker(accelerate::TensorBoardTracker("runs"));
class TensorBoardTracker {
 public:
  explicit TensorBoardTracker(std::filesystem::path dir) : dir_(std::move(dir)) {}
  std::string name() const { return "tensorboard"; }

  void start(const std::string& project, const nlohmann::json& config) {
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

  void log(const Metrics& values, std::int64_t step) {
    record(detail::event(now(), step, 5, detail::scalar_summary(values)));
  }

  void finish() { out_.close(); }

  /// The event file being written.
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  // TFRecord: length (uint64), masked CRC of the length, data, masked CRC of the data.
  void record(const std::string& data) {
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

  std::filesystem::path dir_;
  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace accelerate
