// Bodies of safetensors.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/checkpoint/safetensors.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE bool HeaderReader::number_unsigned(json::number_unsigned_t v) {
  return scalar("a number", [&] {
    if (depth != 3) return value_error("a number");
    auto& list = field == "shape" ? entry.shape : entry.offsets;
    if (field == "shape" && list.size() == safetensors_max_dims)
      return fail_tensor("shape has more than " + std::to_string(safetensors_max_dims) + " dimensions");
    if (field == "data_offsets" && list.size() == 2) return fail_tensor("data_offsets is not a pair");
    list.push_back(v);
    return true;
  });
}

ACCELERATE_INLINE bool HeaderReader::string(json::string_t& text) {
  return scalar("a string", [&] {
    if (in_metadata) {
      metadata[field] = std::move(text);
      return true;
    }
    if (depth == 2 && field == "dtype") {
      entry.dtype = std::move(text);
      entry.has_dtype = true;
      return true;
    }
    return value_error("a string");
  });
}

ACCELERATE_INLINE bool HeaderReader::start_object(std::size_t) {
  if (depth == 0) return ++depth, true;
  if (depth == 1) {
    depth = 2;
    in_metadata = name == "__metadata__";
    entry = RawEntry{};
    return true;
  }
  if (in_metadata) return fail("__metadata__ value '" + field + "' is not a string");
  return fail_tensor("'" + field + "' holds an object (nesting deeper than the format allows)");
}

ACCELERATE_INLINE bool HeaderReader::key(json::string_t& text) {
  if (depth == 1) {
    if (entries.count(text) || (text == "__metadata__" && seen_metadata))
      return fail("tensor name '" + text + "' appears twice in the header");
    name = std::move(text);
    return true;
  }
  if (in_metadata && metadata.count(text)) return fail("__metadata__ key '" + text + "' appears twice");
  if (!in_metadata) {
    if ((text == "dtype" && entry.has_dtype) || (text == "shape" && entry.has_shape) ||
        (text == "data_offsets" && entry.has_offsets))
      return fail_tensor("'" + text + "' appears twice");
  }
  field = std::move(text);
  return true;
}

ACCELERATE_INLINE bool HeaderReader::end_object() {
  if (depth == 2) {
    depth = 1;
    if (in_metadata) {
      in_metadata = false;
      seen_metadata = true;
      return true;
    }
    if (!entry.has_dtype) return fail_tensor("dtype is missing or not a string");
    if (!entry.has_shape) return fail_tensor("shape is missing or not an array");
    if (!entry.has_offsets || entry.offsets.size() != 2) return fail_tensor("data_offsets is missing or not a pair");
    entries.emplace(std::move(name), std::move(entry));
    return true;
  }
  --depth;
  return true;
}

ACCELERATE_INLINE bool HeaderReader::start_array(std::size_t) {
  if (depth == 0) return fail("the header is not a JSON object");
  if (depth == 1) return fail_tensor("its description is not an object but an array");
  if (depth == 2 && !in_metadata && (field == "shape" || field == "data_offsets")) {
    (field == "shape" ? entry.has_shape : entry.has_offsets) = true;
    depth = 3;
    return true;
  }
  if (in_metadata) return fail("__metadata__ value '" + field + "' is not a string");
  if (depth == 3) return fail_tensor(field + " holds an array (nesting deeper than the format allows)");
  if (field == "dtype") return fail_tensor("dtype is missing or not a string");
  return fail_tensor("'" + field + "' holds an array, which the format does not have there");
}

ACCELERATE_INLINE bool HeaderReader::value_error(const std::string& kind) {
  if (in_metadata) return fail("__metadata__ value '" + field + "' is not a string");
  if (depth == 3) return number_error(kind);
  if (field == "dtype") return fail_tensor("dtype is missing or not a string");
  if (field == "shape") return fail_tensor("shape is missing or not an array");
  if (field == "data_offsets") return fail_tensor("data_offsets is missing or not a pair");
  return true;  // another key: ignored, as the format's other readers do
}

ACCELERATE_INLINE void write_all(int fd, const void* data, std::size_t size, const std::string& path) {
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

}  // namespace accelerate::detail

namespace accelerate::checkpoint {

ACCELERATE_INLINE const char* dtype_to_safetensors(at::ScalarType type) {
  for (const auto& d : detail::dtype_names)
    if (d.type == type) return d.name;
  detail::fail("safetensors: dtype ", type, " has no safetensors encoding");
}

ACCELERATE_INLINE std::optional<at::ScalarType> dtype_from_safetensors(const std::string& name) {
  for (const auto& d : detail::dtype_names)
    if (name == d.name) return d.type;
  return std::nullopt;
}

ACCELERATE_INLINE void save_safetensors(const std::filesystem::path& path,
                                        const std::map<std::string, at::Tensor>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
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
    Fd file(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    ACCELERATE_CHECK(file.fd >= 0, "safetensors: cannot create ", temporary.string(), ": ", std::strerror(errno));
    detail::write_all(file.fd, prefix, 8, path.string());
    detail::write_all(file.fd, text.data(), text.size(), path.string());
    for (const auto& t : payloads)
      detail::write_all(file.fd, t.data_ptr(), static_cast<std::size_t>(t.numel()) * t.element_size(),
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

ACCELERATE_INLINE SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile file;
  file.path_ = path.string();
  const std::string& where = file.path_;
  Fd fd(open_regular_file(path, "safetensors"));
  struct stat st {};
  ACCELERATE_CHECK(::fstat(fd.fd, &st) == 0, "safetensors: cannot stat ", where, ": ", std::strerror(errno));
  const auto size = static_cast<std::uint64_t>(st.st_size);
  ACCELERATE_CHECK(size >= 8, "safetensors: ", where, ": file of ", size,
                   " bytes is shorter than the 8-byte header length (truncated file?)");
  // Private and writable: a tensor handed out may be modified in place (an EMA's mul_) without
  // faulting, its pages copied on the first write; the file itself is never changed.
  void* mapping = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd.fd, 0);
  ACCELERATE_CHECK(mapping != MAP_FAILED, "safetensors: cannot map ", where, ": ", std::strerror(errno));
  file.mapping_ = std::shared_ptr<void>(mapping, [size](void* p) { ::munmap(p, size); });
  const auto* bytes = static_cast<const unsigned char*>(mapping);

  std::uint64_t header_length = 0;
  for (int i = 0; i < 8; ++i) header_length |= std::uint64_t{bytes[i]} << (8 * i);
  ACCELERATE_CHECK(header_length <= size - 8, "safetensors: ", where, ": header length ",
                   header_length, " exceeds the file size ", size, " (truncated file?)");
  ACCELERATE_CHECK(header_length <= detail::max_header_bytes, "safetensors: ", where,
                   ": header length ", header_length, " exceeds the limit of ",
                   detail::max_header_bytes, " bytes");
  detail::HeaderReader reader;
  const bool parsed = nlohmann::json::sax_parse(bytes + 8, bytes + 8 + header_length, &reader,
                                                nlohmann::json::input_format_t::json, /*strict=*/true);
  ACCELERATE_CHECK(parsed && reader.error.empty(), "safetensors: ", where, ": ",
                   reader.error.empty() ? std::string("the header is not valid JSON") : reader.error);
  file.data_ = bytes + 8 + header_length;
  const std::uint64_t data_size = size - 8 - header_length;
  file.metadata_ = std::move(reader.metadata);
  for (auto& [name, raw] : reader.entries) file.entries_.emplace(name, parse_entry(where, name, raw, data_size));

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

ACCELERATE_INLINE std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, entry] : entries_) out.push_back(name);
  return out;
}

ACCELERATE_INLINE at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const auto it = entries_.find(name);
  ACCELERATE_CHECK(it != entries_.end(), "safetensors: ", path_, " has no tensor '", name, "'");
  const Entry& e = it->second;
  const auto options = at::TensorOptions().dtype(e.dtype);
  const unsigned char* data = data_ + e.begin;
  const auto item = static_cast<std::uintptr_t>(c10::elementSize(e.dtype));
  if (e.end == e.begin) return at::empty(e.shape, options);
  if (e.dtype == at::kBool) {
    const auto* bad = std::find_if(data, data + (e.end - e.begin), [](unsigned char b) { return b > 1; });
    ACCELERATE_CHECK(bad == data + (e.end - e.begin), "safetensors: ", path_, ": BOOL tensor '", name,
                     "' holds the byte ", static_cast<int>(*bad), " at element ", bad - data,
                     " (only 0 and 1 are booleans)");
  }
  if (reinterpret_cast<std::uintptr_t>(data) % item != 0) {
    at::Tensor copy = at::empty(e.shape, options);
    std::memcpy(copy.data_ptr(), data, e.end - e.begin);
    return copy;
  }
  auto keep = mapping_;
  return at::from_blob(const_cast<unsigned char*>(data), e.shape, [keep](void*) {}, options);
}

ACCELERATE_INLINE std::map<std::string, at::Tensor> SafetensorsFile::tensors() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, entry] : entries_) out.emplace(name, tensor(name));
  return out;
}

ACCELERATE_INLINE std::string SafetensorsFile::list_text(const std::vector<std::uint64_t>& values) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < values.size(); ++i) out << (i ? "," : "") << values[i];
  out << ']';
  return out.str();
}

ACCELERATE_INLINE SafetensorsFile::Entry SafetensorsFile::parse_entry(
    const std::string& where, const std::string& name, const detail::RawEntry& raw, std::uint64_t data_size) {
  auto bad = [&](const std::string& what) -> Entry {
    detail::fail("safetensors: ", where, ": tensor '", name, "': ", what);
  };
  Entry e;
  const auto dtype = dtype_from_safetensors(raw.dtype);
  if (!dtype) return bad("unknown dtype '" + raw.dtype + "'");
  e.dtype = *dtype;
  const std::string shape = list_text(raw.shape), offsets = list_text(raw.offsets);
  // The element count must fit LibTorch's int64 even when a zero dimension makes it 0
  // (LibTorch checks the product of all dimensions).
  constexpr auto limit = static_cast<std::uint64_t>(std::numeric_limits<int64_t>::max());
  std::uint64_t numel = 1, nonzero = 1;
  for (const auto dim : raw.shape) {
    if (dim > limit || (dim != 0 && nonzero > limit / dim))
      return bad("shape " + shape + " overflows: more elements than a tensor can index");
    if (dim != 0) nonzero *= dim;
    numel *= dim;
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  e.begin = raw.offsets[0];
  e.end = raw.offsets[1];
  if (e.begin > e.end) return bad("data_offsets " + offsets + " end before they begin");
  if (e.end > data_size)
    return bad("data_offsets " + offsets + " are past the end of the data (" +
               std::to_string(data_size) + " bytes; truncated file?)");
  const auto item = static_cast<std::uint64_t>(c10::elementSize(e.dtype));
  if (numel > std::numeric_limits<std::uint64_t>::max() / item || e.end - e.begin != numel * item)
    return bad("shape " + shape + " of " + raw.dtype + " needs " + std::to_string(numel * item) +
               " bytes but data_offsets span " + std::to_string(e.end - e.begin));
  return e;
}

}  // namespace accelerate::checkpoint
