// Bodies of parameter_units.hpp (see detail/linkage.hpp).
#pragma once

#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <accelerate/compat/torch.hpp>
#include <accelerate/distributed/end_of_backward.hpp>
#include <accelerate/distributed/parameter_units.hpp>

namespace accelerate::distributed {

ACCELERATE_INLINE at::Tensor storage_alias(const at::Tensor& base, int64_t offset, at::IntArrayRef sizes) {
  at::Tensor alias = at::empty({0}, base.options());
  alias.set_(base.storage(), base.storage_offset() + offset, sizes, c10::contiguous_strides(sizes));
  return alias;
}

ACCELERATE_INLINE const std::vector<int64_t>* ParameterUnits::built_shape(const at::Tensor& param) const {
  const auto it = built_.find(param.unsafeGetTensorImpl());
  return it == built_.end() ? nullptr : &it->second.shape;
}

ACCELERATE_INLINE void ParameterUnits::assign(const std::vector<std::string>& names) {
  unit_of_.assign(names.size(), prefixes_.size());
  for (std::size_t i = 0; i < names.size(); ++i)
    for (std::size_t u = 0; u < prefixes_.size(); ++u)
      if (names[i].rfind(prefixes_[u] + ".", 0) == 0) {
        unit_of_[i] = u;
        break;
      }
  units_.assign(prefixes_.size() + 1, Unit{});
  for (std::size_t i = 0; i < names.size(); ++i) units_[unit_of_[i]].params.push_back(i);
}

ACCELERATE_INLINE void ParameterUnits::shard(const BucketLayout& layout, std::vector<at::Tensor> params,
                                             const std::vector<std::vector<int64_t>>& shapes,
                                             const std::vector<at::TensorOptions>& options,
                                             std::shared_ptr<Communicator> comm,
                                             const std::function<void(std::size_t)>& made_whole) {
  comm_ = std::move(comm);
  params_ = std::move(params);
  shapes_ = shapes;
  const int64_t world = comm_->world_size();
  torch::NoGradGuard no_grad;
  buckets_.assign(layout.size(), Bucket{});
  for (std::size_t b = 0; b < layout.size(); ++b) {
    const LaidOutBucket& laid = layout[b];
    Bucket& held = buckets_[b];
    held.params = laid.params;
    held.offsets = laid.offsets;
    held.options = options.at(b);
    units_[unit_of_[laid.params.front()]].buckets.push_back(b);
    held.full = at::zeros({laid.padded}, held.options);
    for (std::size_t j = 0; j < laid.params.size(); ++j) {
      const std::size_t index = laid.params[j];
      const int64_t numel = c10::multiply_integers(shapes_[index]);
      at::Tensor place = held.full.narrow(0, laid.offsets[j], numel);
      const auto built = built_.find(params_[index].unsafeGetTensorImpl());
      const bool was_cut = built != built_.end();
      if (was_cut) {
        at::Tensor& slice = built->second.slice;
        at::Tensor whole = at::empty({slice.numel() * world}, held.options);
        comm_->all_gather_into(whole, slice, "stage 3 prepare of parameters cut as they were built");
        place.copy_(whole.narrow(0, 0, numel));
        built_.erase(built);
      } else {
        place.copy_(params_[index].detach().reshape(-1));
      }
      params_[index].set_data(storage_alias(held.full, laid.offsets[j], shapes_[index]));
      if (was_cut) made_whole(index);
    }
    const int64_t slice = layout.slice_length(b, world);
    held.shard = held.full.narrow(0, comm_->rank() * slice, slice).clone();
    release_bucket(b);
  }
  for (auto& unit : units_) unit.state = State::released;
}

ACCELERATE_INLINE void ParameterUnits::start_gather(std::size_t unit) {
  if (unit >= units_.size() || units_[unit].state != State::released) return;
  for (const std::size_t b : units_[unit].buckets) {
    Bucket& held = buckets_[b];
    compat::allocate_storage(held.full.storage(), static_cast<std::size_t>(held.full.nbytes()));
    held.gather = comm_->all_gather_into_async(held.full, held.shard);
  }
  units_[unit].state = State::in_flight;
}

ACCELERATE_INLINE void ParameterUnits::gather_unit(std::size_t unit) {
  if (unit >= units_.size() || units_[unit].state == State::gathered) return;
  start_gather(unit);
  torch::NoGradGuard no_grad;
  for (const std::size_t b : units_[unit].buckets) {
    Bucket& held = buckets_[b];
    comm_->wait(held.gather, "parameter all_gather");
    held.gather.reset();
    for (std::size_t j = 0; j < held.params.size(); ++j)
      params_[held.params[j]].set_data(storage_alias(held.full, held.offsets[j], shapes_[held.params[j]]));
  }
  units_[unit].state = State::gathered;
}

ACCELERATE_INLINE void ParameterUnits::release_unit(std::size_t unit) {
  if (unit >= units_.size() || units_[unit].state == State::released) return;
  for (const std::size_t b : units_[unit].buckets) {
    Bucket& held = buckets_[b];
    if (held.gather) {  // an all-gather writing into the buffer finishes first
      comm_->wait(held.gather, "parameter all_gather");
      held.gather.reset();
    }
    release_bucket(b);
  }
  units_[unit].state = State::released;
}

ACCELERATE_INLINE void ParameterUnits::release_bucket(std::size_t bucket) {
  Bucket& held = buckets_[bucket];
  for (const std::size_t index : held.params) params_[index].set_data(at::empty({0}, held.options));
  compat::free_storage(held.full.storage());
}

ACCELERATE_INLINE void ParameterUnits::regather_in_backward(const at::Tensor& output, std::size_t unit,
                                                            std::size_t previous) {
  output.register_hook([weak = weak_from_this(), unit, previous](const at::Tensor&) {
    if (auto held = weak.lock()) {
      held->gather_unit(unit);
      held->prefetch_unit(previous);
    }
  });
}

ACCELERATE_INLINE void ParameterUnits::gradient_arrived(std::size_t index) {
  if (!backward_open_) {
    backward_open_ = true;
    at_end_of_backward(weak_from_this(), &ParameterUnits::end_backward, &ParameterUnits::abandoned_);
  }
  const std::size_t unit = unit_of_[index];
  if (++units_[unit].ready == units_[unit].params.size()) release_unit(unit);
}

ACCELERATE_INLINE void ParameterUnits::end_backward() {
  backward_open_ = false;
  for (auto& unit : units_) unit.ready = 0;
  release_units();
}

ACCELERATE_INLINE void ParameterUnits::recover_abandoned_backward() {
  if (abandoned_.exchange(false)) end_backward();
}

}  // namespace accelerate::distributed
