// Fingerprints of tensors, to find where two runs that should agree bit for bit part: record
// the model's fingerprints each step with any tracker, then first_difference() names the first
// step and the tensors that differ. Not in the umbrella header: include it where it is used.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <accelerate/detail/linkage.hpp>
#include <accelerate/track/tracker.hpp>

namespace accelerate {

/// A 64-bit fingerprint of `tensor`: its dtype, shape and the bytes of its values, read in
/// row-major order (so a non-contiguous tensor and its contiguous copy agree; +0 and -0, or two
/// NaN payloads, differ, as bits do). Two tensors of one dtype and shape that differ in one
/// element (of at most 8 bytes) always have different fingerprints; any other difference is
/// missed with probability about 2^-64. One pass over the values (a device tensor is copied to
/// the CPU first).
/// Example:
///   if (accelerate::fingerprint(a) != accelerate::fingerprint(b)) ...
std::uint64_t fingerprint(const at::Tensor& tensor);

/// For a tracker: "<prefix><name>" for each tensor, its fingerprint's low 52 bits as a double
/// (an integer a double holds exactly, and JsonlTracker writes exactly; TensorBoard's float32
/// scalars round it, so compare JSONL records; a difference then escapes with probability
/// about 2^-52). Pass the full model
/// (acc.get_state_dict(model), which every rank calls under a sharded backend) to compare runs
/// on different numbers of processes.
/// Example:
///   acc.log(accelerate::fingerprint_metrics(acc.get_state_dict(model)), step);
Metrics fingerprint_metrics(const std::map<std::string, at::Tensor>& tensors,
                            const std::string& prefix = "fingerprint/");

/// fingerprint_metrics of the gradients of `module`'s parameters (those defined), under
/// "grad_fingerprint/<name>": what this rank holds (with a sharded backend, only its slices
/// hold gradients after a synchronised backward, so compare gradients at the same world size).
Metrics gradient_fingerprint_metrics(const torch::nn::Module& module);

/// Where two runs' records first part.
struct RunDifference {
  std::int64_t step = 0;
  /// The keys that differ at that step, in name order, without the prefix ("fc.weight"); one
  /// recorded by only one of the runs counts.
  std::vector<std::string> tensors;
};

/// Reads two runs' metric records (JsonlTracker's metrics.jsonl: one JSON object per line with
/// its "step") and compares, step by step in increasing order, the keys that start with
/// `prefix`: the first step at which a fingerprint differs, with every tensor that differs
/// there, or nullopt when the steps both runs recorded agree. Steps only one run recorded are
/// skipped (one run may be longer). A line that is not a JSON object with an integer "step" is
/// an accelerate::Error naming the file and line.
/// Example:
///   if (auto d = accelerate::first_difference("a/run/metrics.jsonl", "b/run/metrics.jsonl"))
///     std::cout << "step " << d->step << ": " << d->tensors.front() << '\n';
std::optional<RunDifference> first_difference(const std::filesystem::path& first, const std::filesystem::path& second,
                                              const std::string& prefix = "fingerprint/");

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/track/fingerprint.ipp>
#endif
