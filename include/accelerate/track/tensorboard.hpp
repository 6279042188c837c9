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
#include <accelerate/detail/linkage.hpp>
#include <accelerate/track/tracker.hpp>

namespace accelerate {

namespace detail {

/// CRC-32C (Castagnoli), as TFRecord uses.
std::uint32_t crc32c(const char* data, std::size_t size);

/// TFRecord's masked CRC: rotated and offset so that CRCs of CRCs do not collide.
inline std::uint32_t masked_crc32c(const char* data, std::size_t size) {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

// Protocol buffer wire format, just what Event and Summary need.
void varint(std::string& out, std::uint64_t value);
inline void key(std::string& out, int field, int wire_type) { varint(out, static_cast<std::uint64_t>(field << 3 | wire_type)); }
void bytes_field(std::string& out, int field, const std::string& bytes);
template <class T>
void fixed(std::string& out, T value) {
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));  // little-endian hosts, as TFRecord
  out.append(raw, sizeof(T));
}

/// An Event: wall_time (1, double), step (2, int64), and file_version (3) or summary (5).
std::string event(double wall_time, std::int64_t step, int what_field, const std::string& what);

/// A Summary with one Value per metric: tag (1, string), simple_value (2, float).
std::string scalar_summary(const Metrics& values);

}  // namespace detail

/// Writes `<dir>/<project>/events.out.tfevents.<time>.<host>` (plus config.json): open it
/// with `tensorboard --logdir <dir>`.
/// Example:
///   acc.add_tracker(accelerate::TensorBoardTracker("runs"));
class TensorBoardTracker {
 public:
  explicit TensorBoardTracker(std::filesystem::path dir) : dir_(std::move(dir)) {}
  std::string name() const { return "tensorboard"; }

  void start(const std::string& project, const nlohmann::json& config);

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
  void record(const std::string& data);

  std::filesystem::path dir_;
  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/track/tensorboard.ipp>
#endif
