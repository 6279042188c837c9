// ZeRO stage 3's parameter store: each rank keeps its slice of every parameter, and the
// parameters of one unit (a block of the model) are all-gathered together just before they
// are used and released right after. The sharded engine owns it; the gradient reducer lays
// out its buckets by unit and tells it as each gradient comes in, so a unit is freed as soon
// as backward is done with it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>

#include <accelerate/detail/linkage.hpp>
#include <accelerate/distributed/bucket_layout.hpp>
#include <accelerate/distributed/communicator.hpp>

namespace accelerate::distributed {

/// Elements of the contiguous `base` from element `offset`, shaped `sizes` (contiguous),
/// sharing its storage but not an autograd view of it: gradients handed to an optimizer must
/// be, since LibTorch's Optimizer::zero_grad detaches them in place, which autograd refuses
/// for views.
at::Tensor storage_alias(const at::Tensor& base, int64_t offset, at::IntArrayRef sizes);
inline at::Tensor storage_alias(const at::Tensor& base, int64_t offset, int64_t length) {
  return storage_alias(base, offset, at::IntArrayRef{length});
}

/// A parameter cut the moment it was built: its shape, and this rank's slice of its flattened
/// values, elements [rank * L, rank * L + L) for L = ceil(numel / world size), zeros past the end.
struct BuiltSlice {
  std::vector<int64_t> shape;
  at::Tensor slice;
};

/// The units of one stage-3 model and where their parameters live. Each bucket of the model's
/// gradient reducer (buckets never span two units) holds its parameters in one flat buffer, of
/// which this rank keeps the r-th slice; the parameters are views of the buffer. Released, the
/// buffer's storage is freed and each parameter is an empty tensor (what a user reading the
/// model between steps sees); gathered, the storage is allocated again in place, so tensors
/// autograd saved in forward (views such as a weight's transpose) read the gathered values in
/// backward. Every rank gathers the same units in the same order (each gather is a collective).
///
/// Life: built by the sharded engine with the unit names; the reducer it is handed to calls
/// assign() with the parameter names, lays out its buckets by unit, then shard(); from then on
/// forward (the engine's model sync, unit_forward) gathers and releases units, and backward's
/// gradient hooks report each gradient (gradient_arrived).
class ParameterUnits : public std::enable_shared_from_this<ParameterUnits> {
 public:
  /// `prefixes`: the units, as name prefixes (a parameter "3.weight" belongs to unit "3");
  /// parameters no prefix names form one more unit, as does everything when it is empty.
  /// `built`: the model's parameters cut as they were built (ShardedEngine::shard_as_built),
  /// each an empty tensor until shard(), by TensorImpl. `prefetch`: DdpOptions::prefetch_units.
  ParameterUnits(std::vector<std::string> prefixes, std::unordered_map<const c10::TensorImpl*, BuiltSlice> built,
                 bool prefetch)
      : prefixes_(std::move(prefixes)), built_(std::move(built)), prefetch_(prefetch) {}

  ParameterUnits(const ParameterUnits&) = delete;
  ParameterUnits& operator=(const ParameterUnits&) = delete;

  /// The shape `param` had when it was cut as it was built; null for any other parameter.
  const std::vector<int64_t>* built_shape(const at::Tensor& param) const;

  /// Each of the named parameters' unit: the first prefix naming it, else the unit after them.
  /// Once, before the reducer lays out its buckets.
  void assign(const std::vector<std::string>& names);
  std::size_t unit_of(std::size_t index) const { return unit_of_.at(index); }

  /// Once the reducer's buckets are laid out (`layout`, over `params` of `shapes`, bucket b's
  /// tensors of `options[b]`): each bucket's parameters are copied into its flat buffer and
  /// become views of it, this rank's slice is kept apart, and the buffer is released before the
  /// next bucket's is made, so the model exists about once while it is cut (all the buffers at
  /// once were a second model at prepare, bench/README.md). A parameter cut as it was built is
  /// all-gathered from every rank's slice instead, one at a time, and `made_whole(index)` runs
  /// once it is whole (its gradient accumulator can be made then). A collective.
  void shard(const BucketLayout& layout, std::vector<at::Tensor> params, const std::vector<std::vector<int64_t>>& shapes,
             const std::vector<at::TensorOptions>& options, std::shared_ptr<Communicator> comm,
             const std::function<void(std::size_t)>& made_whole);

  /// This rank's slice of bucket `bucket`'s parameters (the optimizer's pieces are views of it).
  const at::Tensor& slice(std::size_t bucket) const { return buckets_.at(bucket).shard; }

  /// The units (a unit holding no trainable parameter has nothing to gather).
  std::size_t unit_count() const noexcept { return units_.size(); }
  bool unit_has_parameters(std::size_t unit) const { return unit < units_.size() && !units_[unit].params.empty(); }
  bool unit_gathered(std::size_t unit) const { return unit < units_.size() && units_[unit].state == State::gathered; }
  /// The parameters of `unit` (indices in the reducer's parameters()).
  const std::vector<std::size_t>& unit_parameters(std::size_t unit) const { return units_.at(unit).params; }

  /// Starts the all-gather of `unit`'s parameters (nothing when it is gathered or on its way,
  /// or when DdpOptions::prefetch_units is off: gather_unit gathers it when it is needed).
  void prefetch_unit(std::size_t unit) {
    if (prefetch_) start_gather(unit);
  }
  /// Makes `unit`'s parameters whole: waits for its prefetch, or gathers it now.
  void gather_unit(std::size_t unit);
  /// Frees `unit`'s full parameters (its slice stays); they are empty tensors until gathered.
  void release_unit(std::size_t unit);
  void release_units() {
    for (std::size_t u = 0; u < units_.size(); ++u) release_unit(u);
  }

  /// Hooks `output` (what `unit` computed in forward) so that `unit` is gathered again just
  /// before its backward, when the gradient of its output is known, and the all-gather of
  /// `previous` (the unit whose backward comes next; unit_count() for none) is started.
  void regather_in_backward(const at::Tensor& output, std::size_t unit, std::size_t previous);

  /// Parameter `index`'s gradient came in (the reducer's hook, in backward). Once every
  /// parameter of a unit has its gradient, no autograd node needs the unit's full parameters
  /// any more (a node that read one also computes its gradient), so they are freed now, not
  /// at the end of backward; what is left gathered is freed when backward ends.
  void gradient_arrived(std::size_t index);

  /// After a backward pass that an exception ended: the units it left gathered are released
  /// (nothing happens when no backward was abandoned).
  void recover_abandoned_backward();

 private:
  enum class State { released, in_flight, gathered };
  struct Unit {
    std::vector<std::size_t> buckets;
    std::vector<std::size_t> params;
    State state = State::gathered;  // every parameter is whole until shard()
    std::size_t ready = 0;          // parameters whose gradient came in this backward
  };
  // One reducer bucket's parameters, whole (storage freed while released) and this rank's slice.
  struct Bucket {
    std::vector<std::size_t> params;
    std::vector<int64_t> offsets;  // each parameter's first element in `full`
    at::TensorOptions options;
    at::Tensor shard;  // this rank's slice of the parameters
    at::Tensor full;   // every parameter; storage freed when released
    InFlight gather;   // its all-gather in flight
  };

  // Starts the all-gather of a released unit's parameters into its buckets' full buffers,
  // allocated again in place.
  void start_gather(std::size_t unit);
  // Frees a bucket's full parameters: each parameter an empty tensor until gathered again.
  void release_bucket(std::size_t bucket);
  void end_backward();

  std::vector<std::string> prefixes_;
  std::unordered_map<const c10::TensorImpl*, BuiltSlice> built_;  // until shard()
  bool prefetch_;
  std::shared_ptr<Communicator> comm_;
  std::vector<at::Tensor> params_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<std::size_t> unit_of_;  // parameter -> unit
  std::vector<Unit> units_;
  std::vector<Bucket> buckets_;         // as the reducer's
  bool backward_open_ = false;          // this backward's end-of-backward callback is queued
  std::atomic<bool> abandoned_{false};  // a backward that gathered units threw
};

}  // namespace accelerate::distributed

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/distributed/parameter_units.ipp>
#endif
