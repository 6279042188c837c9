// Bodies of fingerprint.hpp (see detail/linkage.hpp).
#pragma once

#include <cstring>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include <accelerate/detail/check.hpp>
#include <accelerate/track/fingerprint.hpp>

namespace accelerate {

namespace detail {

// One step of the fingerprint: every step is a bijection of the state for a fixed word, and
// of the word for a fixed state, so two inputs differing in one word always end apart.
inline std::uint64_t fingerprint_step(std::uint64_t state, std::uint64_t word) noexcept {
  state = (state ^ word) * 0x9E3779B97F4A7C15ull;  // odd: a bijection modulo 2^64
  return state ^ (state >> 29);
}

// splitmix64's finaliser: spreads every input bit over the output (also a bijection).
inline std::uint64_t fingerprint_finish(std::uint64_t state) noexcept {
  state = (state ^ (state >> 30)) * 0xBF58476D1CE4E5B9ull;
  state = (state ^ (state >> 27)) * 0x94D049BB133111EBull;
  return state ^ (state >> 31);
}

// The 52 low bits, a double holds them exactly.
inline double fingerprint_value(std::uint64_t fingerprint) noexcept {
  return static_cast<double>(fingerprint & ((std::uint64_t{1} << 52) - 1));
}

// step -> (key without the prefix -> value), the records of one run's metrics.jsonl.
inline std::map<std::int64_t, std::map<std::string, double>> read_fingerprints(const std::filesystem::path& file,
                                                                               const std::string& prefix) {
  std::ifstream in(file);
  ACCELERATE_CHECK(in.good(), "first_difference: cannot read ", file.string());
  std::map<std::int64_t, std::map<std::string, double>> steps;
  std::string line;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ACCELERATE_CHECK(record.is_object(), "first_difference: ", file.string(), " line ", number,
                     " is not a JSON object (a JsonlTracker record)");
    const auto step = record.find("step");
    ACCELERATE_CHECK(step != record.end() && step->is_number_integer(), "first_difference: ", file.string(), " line ",
                     number, " has no integer \"step\"");
    auto& values = steps[step->get<std::int64_t>()];  // a step logged twice: its records merge
    for (const auto& [key, value] : record.items()) {
      if (key.rfind(prefix, 0) != 0) continue;
      ACCELERATE_CHECK(value.is_number(), "first_difference: ", file.string(), " line ", number, ": ", key,
                       " is not a number");
      values[key.substr(prefix.size())] = value.get<double>();
    }
  }
  return steps;
}

}  // namespace detail

ACCELERATE_INLINE std::uint64_t fingerprint(const at::Tensor& tensor) {
  const at::Tensor values = tensor.detach().to(at::kCPU).contiguous();
  std::uint64_t state = detail::fingerprint_step(0x243F6A8885A308D3ull, static_cast<std::uint64_t>(values.scalar_type()));
  state = detail::fingerprint_step(state, static_cast<std::uint64_t>(values.dim()));
  for (const int64_t size : values.sizes()) state = detail::fingerprint_step(state, static_cast<std::uint64_t>(size));
  const auto* bytes = static_cast<const unsigned char*>(values.data_ptr());
  const std::size_t length = values.nbytes();
  std::size_t at = 0;
  for (; at + 8 <= length; at += 8) {
    std::uint64_t word;
    std::memcpy(&word, bytes + at, 8);
    state = detail::fingerprint_step(state, word);
  }
  if (at < length) {  // the last bytes, zero-padded (the shape above tells the lengths apart)
    std::uint64_t word = 0;
    std::memcpy(&word, bytes + at, length - at);
    state = detail::fingerprint_step(state, word);
  }
  return detail::fingerprint_finish(state);
}

ACCELERATE_INLINE Metrics fingerprint_metrics(const std::map<std::string, at::Tensor>& tensors,
                                              const std::string& prefix) {
  Metrics metrics;
  for (const auto& [name, tensor] : tensors) metrics[prefix + name] = detail::fingerprint_value(fingerprint(tensor));
  return metrics;
}

ACCELERATE_INLINE Metrics gradient_fingerprint_metrics(const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> grads;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    if (item.value().grad().defined()) grads[item.key()] = item.value().grad();
  return fingerprint_metrics(grads, "grad_fingerprint/");
}

ACCELERATE_INLINE std::optional<RunDifference> first_difference(const std::filesystem::path& first,
                                                                const std::filesystem::path& second,
                                                                const std::string& prefix) {
  const auto a = detail::read_fingerprints(first, prefix);
  const auto b = detail::read_fingerprints(second, prefix);
  for (const auto& [step, values] : a) {
    const auto other = b.find(step);
    if (other == b.end()) continue;
    std::set<std::string> names;
    for (const auto& entry : values) names.insert(entry.first);
    for (const auto& entry : other->second) names.insert(entry.first);
    RunDifference difference{step, {}};
    for (const auto& name : names) {
      const auto x = values.find(name), y = other->second.find(name);
      if (x == values.end() || y == other->second.end() || x->second != y->second) difference.tensors.push_back(name);
    }
    if (!difference.tensors.empty()) return difference;
  }
  return std::nullopt;
}

}  // namespace accelerate
