// Safetensors files: a writer, and a reader that validates the whole header (length, JSON,
// dtypes, shapes, offsets, duplicate names) before touching any tensor data and maps the file
// copy-on-write. Format: 8-byte little-endian header length N, N bytes of JSON, then the
// tensors' bytes.
//
// The header comes from outside, so it is parsed as a stream against the format's fixed shape
// (an object of tensor descriptions plus "__metadata__" of strings, nothing nested deeper):
// memory stays a small multiple of the header's size whatever the file holds. (A DOM parse of
// a 99 MB header of nested arrays took 3.7 GB.)
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <accelerate/checkpoint/files.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate::checkpoint {

}  // namespace accelerate::checkpoint

namespace accelerate::detail {

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
inline constexpr DtypeName dtype_names[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool}};

/// Largest header accepted (the safetensors library's own limit).
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

using checkpoint::Fd;

/// Most dimensions a tensor description may have (LibTorch itself stays far below this).
inline constexpr std::size_t safetensors_max_dims = 64;

/// One tensor description as read, before its meaning is checked.
struct RawEntry {
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::vector<std::uint64_t> offsets;
  bool has_dtype = false, has_shape = false, has_offsets = false;
};

/// Streaming reader of a safetensors header (nlohmann's SAX interface): enforces the format's
/// shape as it goes and stops at the first problem, which it keeps in `error`.
struct HeaderReader {
  using json = nlohmann::json;
  std::map<std::string, RawEntry> entries;
  std::map<std::string, std::string> metadata;
  std::string error;

  // Where the parser is: 0 outside, 1 in the top object, 2 in a tensor description or the
  // metadata, 3 in a shape or data_offsets array.
  int depth = 0;
  bool in_metadata = false;
  std::string name;   // the tensor (depth >= 2)
  std::string field;  // its key being read (depth >= 2)
  RawEntry entry;

  bool fail(std::string what) {
    if (error.empty()) error = std::move(what);
    return false;
  }
  bool fail_tensor(const std::string& what) { return fail("tensor '" + name + "': " + what); }

  /// A scalar value at the current place.
  template <class Describe>
  bool scalar(const char* kind, Describe&& accept) {
    if (depth == 0) return fail("the header is not a JSON object");
    if (depth == 1) {
      return name == "__metadata__" ? fail("__metadata__ is not an object")
                                    : fail_tensor(std::string("its description is not an object but ") + kind);
    }
    return accept();
  }

  bool null() { return scalar("null", [&] { return value_error("null"); }); }
  bool boolean(bool) { return scalar("a boolean", [&] { return value_error("a boolean"); }); }
  bool number_float(json::number_float_t, const json::string_t&) {
    return scalar("a number", [&] { return number_error("a fractional number"); });
  }
  bool number_integer(json::number_integer_t v) {
    if (v >= 0) return number_unsigned(static_cast<json::number_unsigned_t>(v));
    return scalar("a number", [&] { return number_error("a negative number"); });
  }
  bool number_unsigned(json::number_unsigned_t v);
  bool string(json::string_t& text);
  bool binary(json::binary_t&) { return fail("the header holds binary data"); }

  bool start_object(std::size_t);
  bool key(json::string_t& text);
  bool end_object();
  bool start_array(std::size_t);
  bool end_array() {
    depth = 2;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    return fail("the header is not valid JSON at byte " + std::to_string(position) + " (" + e.what() + ")");
  }

 private:
  bool seen_metadata = false;

  bool value_error(const std::string& kind);
  bool number_error(const std::string& kind) {
    if (depth != 3) return value_error(kind);
    return fail_tensor(field + " holds a non-natural number (" + kind + ")");
  }
};

void write_all(int fd, const void* data, std::size_t size, const std::string& path);

}  // namespace accelerate::detail

namespace accelerate::checkpoint {

/// The safetensors name of a dtype ("F32", "BF16", ...), or an error naming the dtype.
const char* dtype_to_safetensors(at::ScalarType type);

/// The dtype of a safetensors name, or nullopt for an unknown name.
std::optional<at::ScalarType> dtype_from_safetensors(const std::string& name);

/// Writes `tensors` (any device; copied to the CPU as needed) to `path` with optional string
/// metadata, in name order, and fsyncs the file (written under a temporary name and renamed). The header is padded with spaces to a
/// multiple of 8 bytes so every tensor's data is 8-byte aligned.
/// Example:
///   accelerate::checkpoint::save_safetensors("w.safetensors", {{"w", torch::ones({2})}}, {{"format", "pt"}});
void save_safetensors(const std::filesystem::path& path,
                      const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// A validated, memory-mapped safetensors file. Tensors read from it are views of the mapping
/// (copies when the data is not aligned for its dtype) that keep it alive.
/// Example:
///   auto file = accelerate::checkpoint::SafetensorsFile::open("model.safetensors");
///   for (const auto& name : file.names()) use(name, file.tensor(name));
class SafetensorsFile {
 public:
  struct Entry {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    std::uint64_t begin = 0;  // offsets into the data area
    std::uint64_t end = 0;
  };

  /// Opens and validates `path`. Every problem is an error naming the file and what is wrong:
  /// truncation, an oversized or non-JSON header, unknown dtypes, bad shapes, offsets out of
  /// range, overlapping or leaving holes.
  static SafetensorsFile open(const std::filesystem::path& path);

  const std::string& path() const noexcept { return path_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  const std::map<std::string, Entry>& entries() const noexcept { return entries_; }
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }

  std::vector<std::string> names() const;

  /// The tensor `name` on the CPU, backed by the file's private mapping when aligned (kept
  /// alive as long as the tensor): safe to modify in place and to keep after the file object
  /// is gone; writes never reach the file. A BOOL tensor holding a byte other than 0 or 1 is
  /// an error.
  at::Tensor tensor(const std::string& name) const;

  /// Every tensor of the file.
  std::map<std::string, at::Tensor> tensors() const;

 private:
  static std::string list_text(const std::vector<std::uint64_t>& values);

  static Entry parse_entry(const std::string& where, const std::string& name,
                           const detail::RawEntry& raw, std::uint64_t data_size);

  std::string path_;
  std::shared_ptr<void> mapping_;
  const unsigned char* data_ = nullptr;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, Entry> entries_;
};

}  // namespace accelerate::checkpoint

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/checkpoint/safetensors.ipp>
#endif
