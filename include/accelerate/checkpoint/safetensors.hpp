// Safetensors files: a writer, and a reader that validates the whole header (length, JSON,
// dtypes, shapes, offsets) before touching any tensor data and memory-maps the file.
// Format: 8-byte little-endian header length N, N bytes of JSON, then the tensors' bytes.
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
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <accelerate/detail/check.hpp>

namespace accelerate::checkpoint {

namespace safetensors_detail {

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

/// An open file descriptor, closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int value) : fd(value) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

inline void write_all(int fd, const void* data, std::size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    ACCELERATE_CHECK(n > 0, "safetensors: writing ", path, " failed: ", std::strerror(errno),
                     " (disk full?)");
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

}  // namespace safetensors_detail

/// The safetensors name of a dtype ("F32", "BF16", ...), or an error naming the dtype.
inline const char* dtype_to_safetensors(at::ScalarType type) {
  for (const auto& d : safetensors_detail::dtype_names)
    if (d.type == type) return d.name;
  detail::fail("safetensors: dtype ", type, " has no safetensors encoding");
}

/// The dtype of a safetensors name, or nullopt for an unknown name.
inline std::optional<at::ScalarType> dtype_from_safetensors(const std::string& name) {
  for (const auto& d : safetensors_detail::dtype_names)
    if (name == d.name) return d.type;
  return std::nullopt;
}

/// Writes `tensors` (any device; copied to the CPU as needed) to `path` with optional string
/// metadata, in name order, and fsyncs the file (written under a temporary name and renamed). The header is padded with spaces to a
/// multiple of 8 bytes so every tensor's data is 8-byte aligned.
/// Example:
///   accelerate::checkpoint::save_safetensors("w.safetensors", {{"w", torch::ones({2})}}, {{"format", "pt"}});
inline void save_safetensors(const std::filesystem::path& path,
                             const std::map<std::string, at::Tensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  // Larger elements first (then by name), as the safetensors library does: with the header
  // padded to 8 bytes, every tensor then starts aligned for its dtype.
  std::vector<std::pair<std::string, at::Tensor>> ordered(tensors.begin(), tensors.end());
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    return a.second.defined() && b.second.defined() && a.second.element_size() > b.second.element_size();
  });
  std::vector<at::Tensor> payloads;
  std::uint64_t offset = 0;
  for (const auto& [name, tensor] : ordered) {
    ACCELERATE_CHECK(name != "__metadata__", "safetensors: '__metadata__' is not a tensor name");
    ACCELERATE_CHECK(tensor.defined(), "safetensors: tensor '", name, "' is undefined");
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const auto bytes = static_cast<std::uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", dtype_to_safetensors(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    payloads.push_back(std::move(t));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::uint64_t length = text.size();
  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(length >> (8 * i));

  // Written beside the target and renamed over it once complete and fsynced, so an existing
  // file is never left half-overwritten.
  const std::filesystem::path temporary = path.string() + ".tmp-" + std::to_string(::getpid());
  try {
    safetensors_detail::Fd file(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    ACCELERATE_CHECK(file.fd >= 0, "safetensors: cannot create ", temporary.string(), ": ", std::strerror(errno));
    safetensors_detail::write_all(file.fd, prefix, 8, path.string());
    safetensors_detail::write_all(file.fd, text.data(), text.size(), path.string());
    for (const auto& t : payloads)
      safetensors_detail::write_all(file.fd, t.data_ptr(), static_cast<std::size_t>(t.numel()) * t.element_size(),
                                    path.string());
    ACCELERATE_CHECK(::fsync(file.fd) == 0, "safetensors: fsync of ", path.string(), " failed: ",
                     std::strerror(errno));
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw;
  }
  std::filesystem::rename(temporary, path);
}

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
  static SafetensorsFile open(const std::filesystem::path& path) {
    SafetensorsFile file;
    file.path_ = path.string();
    const std::string& where = file.path_;
    safetensors_detail::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    ACCELERATE_CHECK(fd.fd >= 0, "safetensors: cannot open ", where, ": ", std::strerror(errno));
    struct stat st {};
    ACCELERATE_CHECK(::fstat(fd.fd, &st) == 0 && S_ISREG(st.st_mode), "safetensors: ", where,
                     " is not a regular file");
    const auto size = static_cast<std::uint64_t>(st.st_size);
    ACCELERATE_CHECK(size >= 8, "safetensors: ", where, ": file of ", size,
                     " bytes is shorter than the 8-byte header length (truncated file?)");
    void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
    ACCELERATE_CHECK(mapping != MAP_FAILED, "safetensors: cannot map ", where, ": ", std::strerror(errno));
    file.mapping_ = std::shared_ptr<void>(mapping, [size](void* p) { ::munmap(p, size); });
    const auto* bytes = static_cast<const unsigned char*>(mapping);

    std::uint64_t header_length = 0;
    for (int i = 0; i < 8; ++i) header_length |= std::uint64_t{bytes[i]} << (8 * i);
    ACCELERATE_CHECK(header_length <= size - 8, "safetensors: ", where, ": header length ",
                     header_length, " exceeds the file size ", size, " (truncated file?)");
    ACCELERATE_CHECK(header_length <= safetensors_detail::max_header_bytes, "safetensors: ", where,
                     ": header length ", header_length, " exceeds the limit of ",
                     safetensors_detail::max_header_bytes, " bytes");
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_length);
    } catch (const nlohmann::json::exception& e) {
      detail::fail("safetensors: ", where, ": the header is not valid JSON (", e.what(), ")");
    }
    ACCELERATE_CHECK(header.is_object(), "safetensors: ", where, ": the header is not a JSON object");
    file.data_ = bytes + 8 + header_length;
    const std::uint64_t data_size = size - 8 - header_length;

    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__") {
        ACCELERATE_CHECK(value.is_object(), "safetensors: ", where, ": __metadata__ is not an object");
        for (const auto& [key, text] : value.items()) {
          ACCELERATE_CHECK(text.is_string(), "safetensors: ", where, ": __metadata__ value '", key,
                           "' is not a string");
          file.metadata_[key] = text.get<std::string>();
        }
        continue;
      }
      file.entries_.emplace(name, parse_entry(where, name, value, data_size));
    }

    // Offsets must tile the data area exactly: no overlap, no hole, nothing past the end.
    std::vector<std::pair<std::uint64_t, const std::string*>> spans;
    for (const auto& [name, entry] : file.entries_)
      if (entry.end > entry.begin) spans.emplace_back(entry.begin, &name);
    std::sort(spans.begin(), spans.end());
    std::uint64_t covered = 0;
    for (const auto& [begin, name] : spans) {
      ACCELERATE_CHECK(begin >= covered, "safetensors: ", where, ": tensor '", *name, "' at offset ",
                       begin, " overlaps the previous tensor, which ends at ", covered);
      ACCELERATE_CHECK(begin == covered, "safetensors: ", where, ": ", begin - covered,
                       " unreferenced bytes before tensor '", *name, "'");
      covered = file.entries_.at(*name).end;
    }
    ACCELERATE_CHECK(covered == data_size, "safetensors: ", where, ": the data area has ", data_size,
                     " bytes but the tensors describe ", covered,
                     covered < data_size ? " (trailing garbage?)" : " (truncated file?)");
    return file;
  }

  const std::string& path() const noexcept { return path_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  const std::map<std::string, Entry>& entries() const noexcept { return entries_; }
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, entry] : entries_) out.push_back(name);
    return out;
  }

  /// The tensor `name` on the CPU, backed by the mapping when aligned.
  at::Tensor tensor(const std::string& name) const {
    const auto it = entries_.find(name);
    ACCELERATE_CHECK(it != entries_.end(), "safetensors: ", path_, " has no tensor '", name, "'");
    const Entry& e = it->second;
    const auto options = at::TensorOptions().dtype(e.dtype);
    const unsigned char* data = data_ + e.begin;
    const auto item = static_cast<std::uintptr_t>(c10::elementSize(e.dtype));
    if (e.end == e.begin) return at::empty(e.shape, options);
    if (reinterpret_cast<std::uintptr_t>(data) % item != 0) {
      at::Tensor copy = at::empty(e.shape, options);
      std::memcpy(copy.data_ptr(), data, e.end - e.begin);
      return copy;
    }
    auto keep = mapping_;
    return at::from_blob(const_cast<unsigned char*>(data), e.shape, [keep](void*) {}, options);
  }

  /// Every tensor of the file.
  std::map<std::string, at::Tensor> tensors() const {
    std::map<std::string, at::Tensor> out;
    for (const auto& [name, entry] : entries_) out.emplace(name, tensor(name));
    return out;
  }

 private:
  static Entry parse_entry(const std::string& where, const std::string& name, const nlohmann::json& value,
                           std::uint64_t data_size) {
    auto bad = [&](const std::string& what) -> Entry {
      detail::fail("safetensors: ", where, ": tensor '", name, "': ", what);
    };
    if (!value.is_object()) return bad("its description is not an object");
    const auto dtype_it = value.find("dtype");
    const auto shape_it = value.find("shape");
    const auto offsets_it = value.find("data_offsets");
    if (dtype_it == value.end() || !dtype_it->is_string()) return bad("dtype is missing or not a string");
    if (shape_it == value.end() || !shape_it->is_array()) return bad("shape is missing or not an array");
    if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2)
      return bad("data_offsets is missing or not a pair");
    Entry e;
    const auto dtype = dtype_from_safetensors(dtype_it->get<std::string>());
    if (!dtype) return bad("unknown dtype '" + dtype_it->get<std::string>() + "'");
    e.dtype = *dtype;
    std::uint64_t numel = 1;
    for (const auto& d : *shape_it) {
      if (!d.is_number_unsigned()) return bad("shape " + shape_it->dump() + " holds a non-natural number");
      const auto dim = d.get<std::uint64_t>();
      if (dim > static_cast<std::uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (dim != 0 && numel > std::numeric_limits<std::uint64_t>::max() / dim))
        return bad("shape " + shape_it->dump() + " overflows");
      numel *= dim;
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    for (const auto& o : *offsets_it)
      if (!o.is_number_unsigned()) return bad("data_offsets " + offsets_it->dump() + " are not natural numbers");
    e.begin = (*offsets_it)[0].get<std::uint64_t>();
    e.end = (*offsets_it)[1].get<std::uint64_t>();
    if (e.begin > e.end) return bad("data_offsets " + offsets_it->dump() + " end before they begin");
    if (e.end > data_size)
      return bad("data_offsets " + offsets_it->dump() + " are past the end of the data (" +
                 std::to_string(data_size) + " bytes; truncated file?)");
    const auto item = static_cast<std::uint64_t>(c10::elementSize(e.dtype));
    if (numel > std::numeric_limits<std::uint64_t>::max() / item || e.end - e.begin != numel * item)
      return bad("shape " + shape_it->dump() + " of " + dtype_it->get<std::string>() + " needs " +
                 std::to_string(numel * item) + " bytes but data_offsets span " +
                 std::to_string(e.end - e.begin));
    return e;
  }

  std::string path_;
  std::shared_ptr<void> mapping_;
  const unsigned char* data_ = nullptr;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, Entry> entries_;
};

}  // namespace accelerate::checkpoint
