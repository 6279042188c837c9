// Bodies of reducer.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/distributed/reducer.hpp>

namespace accelerate::distributed {

ACCELERATE_INLINE ReducerOptions ReducerOptions::from(const DdpOptions& ddp, Sharding sharding) {
  return {ddp.bucket_cap_bytes, ddp.first_bucket_cap_bytes, ddp.find_unused_parameters, sharding,
          ddp.gradient_as_bucket_view, ddp.bucket_order_from_arrival, ddp.sum_in_rank_order, ddp.compression,
          ddp.power_sgd,
          {}, ddp.prefetch_units, ddp.sharded_buckets_in_flight};
}

ACCELERATE_INLINE at::Tensor storage_alias(const at::Tensor& base, int64_t offset, at::IntArrayRef sizes) {
  at::Tensor alias = at::empty({0}, base.options());
  alias.set_(base.storage(), base.storage_offset() + offset, sizes, c10::contiguous_strides(sizes));
  return alias;
}

ACCELERATE_INLINE GradientReducer::GradientReducer(std::vector<std::pair<std::string, at::Tensor>> named_params,
                                                   std::shared_ptr<Communicator> comm, ReducerOptions options)
    : comm_(std::move(comm)), options_(std::move(options)) {
  ACCELERATE_CHECK(!sharded() || options_.compression == GradientCompression::none,
                   "gradient compression (AcceleratorOptions::ddp.compression = ", to_string(options_.compression),
                   ") works with replicated data parallel only, not with a sharded backend");
  if (sharded()) {
    // Stage 1's .grad become views of the (persistent) buckets while a synchronised backward
    // runs, so each fresh gradient is freed as soon as it is in its bucket: one copy of the
    // gradients instead of two at the peak. Stage 2's buckets are freed after each
    // reduce-scatter, so its gradients cannot live in them.
    if (scatters()) options_.gradient_as_bucket_view = false;
    options_.bucket_order_from_arrival = false;  // the optimizer's slices are cut from this layout
  }
  for (auto& [name, p] : named_params) {
    if (!p.requires_grad()) continue;
    if (sharded())
      ACCELERATE_CHECK(p.is_contiguous(), "sharded gradient sync: parameter '", name,
                       "' is not contiguous, so its shard cannot be a view of it");
    names_.push_back(name);
    params_.push_back(p);
    const auto built = options_.built.find(p.unsafeGetTensorImpl());
    if (built != options_.built.end()) {
      ACCELERATE_CHECK(shards_parameters(), "parameter '", name,
                       "' was cut as it was built (shard_as_built), which only stage 3 can prepare");
      shape_.push_back(built->second.shape);
      numel_.push_back(c10::multiply_integers(shape_.back()));
      built_.push_back(std::move(built->second.slice));
    } else {
      shape_.emplace_back(p.sizes().begin(), p.sizes().end());
      numel_.push_back(p.numel());
      built_.emplace_back();
    }
  }
  options_.built.clear();
  // Two ranks add a + b whatever the order, so the two collectives buy nothing there.
  ordered_sums_ = options_.sum_in_rank_order && !scatters() && comm_->world_size() > 2 && comm_->sums_in_rank_order();
  assign_units();
  build_buckets(initial_order());
  // Each parameter's gradient accumulator, made while the parameter is whole: it records
  // the parameter's shape, and stage 3 releases the parameters right away (one cut as it
  // was built gets its own once shard_parameters has made it whole).
  accumulators_.resize(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!built_[i].defined()) make_accumulator(i);
  if (shards_parameters()) shard_parameters();
  if (sharded()) build_shard_pieces();
  ready_.assign(params_.size(), false);
  used_.assign(params_.size(), false);
  window_used_.assign(params_.size(), false);
}

ACCELERATE_INLINE void GradientReducer::install_hooks() {
  std::weak_ptr<GradientReducer> weak = weak_from_this();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto key = accumulators_[i]->add_post_hook(std::make_unique<ReadyHook>(weak, i));
    hooks_.emplace_back(std::move(accumulators_[i]), key);
  }
  accumulators_.clear();
}

ACCELERATE_INLINE void GradientReducer::shadow_round(int ranks) {
  prepare_joined_round(ranks, true);
  open_round(/*from_backward=*/false);
  for (const auto& bucket : buckets_)
    for (const std::size_t index : bucket.params) mark_ready(index, /*used=*/false);
  finish_round();
}

ACCELERATE_INLINE void GradientReducer::expect_gradients_from(const std::vector<at::Tensor>& outputs) {
  unreachable_.clear();
  if (!options_.find_unused_parameters || !sync_) return;
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  for (const auto& t : outputs)
    if (t.defined() && t.requires_grad() && t.grad_fn()) stack.push_back(t.grad_fn().get());
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges())
      if (edge.function && !seen.count(edge.function.get())) stack.push_back(edge.function.get());
  }
  unreachable_.assign(params_.size(), false);
  for (std::size_t i = 0; i < params_.size(); ++i)
    unreachable_[i] = !seen.count(hooks_[i].first.get());
}

ACCELERATE_INLINE std::vector<std::vector<std::size_t>> GradientReducer::bucket_layout() const {
  std::vector<std::vector<std::size_t>> out;
  for (const auto& b : buckets_) out.push_back(b.params);
  return out;
}

ACCELERATE_INLINE nlohmann::json GradientReducer::layout_state() const {
  nlohmann::json state = {{"sync_rounds", sync_rounds_}, {"order_settled", order_settled_},
                          {"world_size", comm_->world_size()}};
  if (order_settled_) state["bucket_order"] = launch_order();
  return state;
}

ACCELERATE_INLINE void GradientReducer::load_layout_state(const nlohmann::json& state) {
  ACCELERATE_CHECK(state.is_object() && state.contains("sync_rounds") && state.contains("order_settled") &&
                       state.at("sync_rounds").is_number_unsigned() && state.at("order_settled").is_boolean(),
                   "gradient sync state: expected sync_rounds and order_settled, got ", state.dump());
  const bool settled = state.at("order_settled").get<bool>();
  std::vector<std::size_t> order = initial_order();
  if (settled) {
    ACCELERATE_CHECK(state.contains("bucket_order") && state.at("bucket_order").is_array(),
                     "gradient sync state: a settled order needs bucket_order, got ", state.dump());
    const auto saved = parameter_order(state.at("bucket_order").get<std::vector<std::int64_t>>());
    ACCELERATE_CHECK(saved.has_value(), "gradient sync state: bucket_order is not an order of this model's ",
                     params_.size(), " parameters: ", state.at("bucket_order").dump());
    order = *saved;
  }
  sync_rounds_ = state.at("sync_rounds").get<std::size_t>();
  if (sharded()) return;  // a sharded optimizer's slices are cut from the initial layout
  relayout(order);
  order_settled_ = settled;
}

ACCELERATE_INLINE std::map<std::string, at::Tensor> GradientReducer::compression_state() const {
  std::map<std::string, at::Tensor> saved;
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    for (auto& [name, tensor] : buckets_[b].compressor.state()) saved["bucket" + std::to_string(b) + "." + name] = tensor;
  return saved;
}

ACCELERATE_INLINE void GradientReducer::load_compression_state(
    const std::map<std::string, at::Tensor>& saved, int saved_world_size) {
  std::vector<std::map<std::string, at::Tensor>> per_bucket(buckets_.size());
  for (const auto& [key, tensor] : saved) {
    const auto dot = key.find('.');
    std::size_t b = buckets_.size();
    if (key.rfind("bucket", 0) == 0 && dot != std::string::npos) {
      try {
        b = std::stoul(key.substr(6, dot - 6));
      } catch (const std::exception&) {
      }
    }
    ACCELERATE_CHECK(b < buckets_.size(), "gradient sync state: '", key, "' names no bucket of this model's ",
                     buckets_.size());
    per_bucket[b][key.substr(dot + 1)] = tensor;
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b) buckets_[b].compressor.check_state(per_bucket[b]);
  const bool same_world = saved_world_size < 0 || saved_world_size == comm_->world_size();
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    buckets_[b].compressor.load_state(per_bucket[b], buckets_[b].options, same_world);
}

ACCELERATE_INLINE std::size_t GradientReducer::gradient_memory_bytes() const {
  std::unordered_set<const void*> seen;
  std::size_t total = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined() && seen.insert(t.storage().data()).second) total += t.storage().nbytes();
  };
  for (const auto& bucket : buckets_) {
    add(bucket.flat);
    add(bucket.shard);
    total += bucket.compressor.state_bytes();
  }
  for (const auto& p : params_) add(p.grad());
  for (const auto& t : piece_tensors_) add(t.grad());
  return total;
}

ACCELERATE_INLINE std::pair<int64_t, int64_t> GradientReducer::held_by(std::size_t index, int rank) const {
  const Bucket& bucket = buckets_.at(bucket_of_.at(index));
  const int64_t length = slice_length(bucket);
  const int64_t offset = bucket.offsets[position_of_[index]];
  const int64_t begin = std::clamp<int64_t>(rank * length - offset, 0, numel_[index]);
  const int64_t end = std::clamp<int64_t>((rank + 1) * length - offset, 0, numel_[index]);
  return {begin, std::max(begin, end)};
}

ACCELERATE_INLINE void GradientReducer::gather_parameters(std::size_t bucket_index) {
  torch::NoGradGuard no_grad;
  const Bucket& bucket = buckets_.at(bucket_index);
  const int64_t length = slice_length(bucket);
  at::Tensor mine = at::zeros({length}, params_[bucket.params.front()].options().requires_grad(false));
  for (std::size_t k = 0; k < pieces_.size(); ++k)
    if (pieces_[k].bucket == bucket_index)
      mine.narrow(0, pieces_[k].shard_offset, pieces_[k].length).copy_(piece_tensors_[k]);
  at::Tensor whole = at::empty({bucket.padded}, mine.options());
  comm_->all_gather_into(whole, mine, "parameter all_gather");
  for (std::size_t j = 0; j < bucket.params.size(); ++j) {
    at::Tensor param = params_[bucket.params[j]].detach();
    param.view(-1).copy_(whole.narrow(0, bucket.offsets[j], param.numel()));
  }
}

ACCELERATE_INLINE void GradientReducer::gather_unit(std::size_t unit) {
  if (unit >= units_.size() || units_[unit].state == UnitState::gathered) return;
  start_gather(unit);
  torch::NoGradGuard no_grad;
  for (const std::size_t b : units_[unit].buckets) {
    Bucket& bucket = buckets_[b];
    comm_->wait(bucket.gather_work, "parameter all_gather");
    bucket.gather_work.reset();
    for (std::size_t j = 0; j < bucket.params.size(); ++j)
      params_[bucket.params[j]].set_data(storage_alias(bucket.param_full, bucket.offsets[j], shape_[bucket.params[j]]));
  }
  units_[unit].state = UnitState::gathered;
}

ACCELERATE_INLINE void GradientReducer::release_unit(std::size_t unit) {
  if (unit >= units_.size() || units_[unit].state == UnitState::released) return;
  for (const std::size_t b : units_[unit].buckets) {
    Bucket& bucket = buckets_[b];
    if (bucket.gather_work) {  // an all-gather writing into the buffer finishes first
      comm_->wait(bucket.gather_work, "parameter all_gather");
      bucket.gather_work.reset();
    }
    release_bucket(bucket);
  }
  units_[unit].state = UnitState::released;
}

ACCELERATE_INLINE void GradientReducer::regather_in_backward(
    const at::Tensor& output, std::size_t unit, std::size_t previous) {
  output.register_hook([weak = weak_from_this(), unit, previous](const at::Tensor&) {
    if (auto held = weak.lock()) {
      held->gather_unit(unit);
      held->prefetch_unit(previous);
    }
  });
}

ACCELERATE_INLINE void GradientReducer::build_buckets(const std::vector<std::size_t>& order) {
  // Open bucket per (device type, device index, dtype).
  std::map<std::tuple<int, int, int>, std::size_t> open;
  buckets_.clear();
  bucket_of_.assign(params_.size(), 0);
  position_of_.assign(params_.size(), 0);
  std::vector<std::size_t> bucket_bytes;
  std::size_t unit = shards_parameters() && !order.empty() ? unit_of_[order.front()] : 0;
  for (const std::size_t k : order) {
    const auto& p = params_[k];
    if (shards_parameters() && unit_of_[k] != unit) {  // a unit's buckets are its own
      open.clear();
      unit = unit_of_[k];
    }
    const std::tuple<int, int, int> key{static_cast<int>(p.device().type()), p.device().index(),
                                        static_cast<int>(p.scalar_type())};
    auto it = open.find(key);
    if (it == open.end()) {
      buckets_.emplace_back();
      bucket_bytes.push_back(0);
      it = open.emplace(key, buckets_.size() - 1).first;
    }
    Bucket& bucket = buckets_[it->second];
    bucket.offsets.push_back(bucket.params.empty()
                                 ? 0
                                 : bucket.offsets.back() + numel_[bucket.params.back()]);
    position_of_[k] = bucket.params.size();
    bucket.params.push_back(k);
    bucket_of_[k] = it->second;
    bucket_bytes[it->second] += static_cast<std::size_t>(numel_[k]) * p.element_size();
    const std::size_t cap = it->second == 0 ? options_.first_bucket_cap_bytes : options_.bucket_cap_bytes;
    if (bucket_bytes[it->second] >= cap) open.erase(it);  // full: the next one opens anew
  }
  const int64_t world = comm_->world_size();
  for (auto& bucket : buckets_) {
    const auto& last = params_[bucket.params.back()];
    const int64_t total = bucket.offsets.back() + numel_[bucket.params.back()];
    bucket.options = last.options().requires_grad(false);
    bucket.padded = sharded() || ordered_sums_ ? (total + world - 1) / world * world : total;
    if (scatters()) bucket.shard = at::zeros({slice_length(bucket)}, bucket.options);
    else bucket.flat = at::zeros({ordered_sums_ ? bucket.padded : total}, bucket.options);
    bucket.pending = bucket.params.size();
    if (options_.compression != GradientCompression::none) {
      std::vector<BucketEntry> entries;
      for (std::size_t j = 0; j < bucket.params.size(); ++j) {
        const auto sizes = params_[bucket.params[j]].sizes();
        entries.push_back({bucket.offsets[j], std::vector<int64_t>(sizes.begin(), sizes.end())});
      }
      bucket.compressor = BucketCompressor(options_.compression, options_.power_sgd, std::move(entries));
    }
  }
}

ACCELERATE_INLINE std::vector<std::size_t> GradientReducer::initial_order() const {
  std::vector<std::size_t> reverse(params_.size());
  for (std::size_t k = 0; k < reverse.size(); ++k) reverse[k] = reverse.size() - 1 - k;
  return reverse;
}

ACCELERATE_INLINE std::vector<std::size_t> GradientReducer::launch_order() const {
  std::vector<std::size_t> order;
  for (const auto& bucket : buckets_) order.insert(order.end(), bucket.params.begin(), bucket.params.end());
  return order;
}

ACCELERATE_INLINE bool GradientReducer::can_adopt(const Bucket& bucket, const at::Tensor& grad) const {
  return scatters() && bucket.params.size() == 1 && grad.defined() && grad.layout() == at::kStrided &&
         grad.numel() == bucket.padded && grad.is_contiguous() && grad.dtype() == bucket.options.dtype() &&
         grad.device() == bucket.options.device() && grad.use_count() == 1;
}

ACCELERATE_INLINE void GradientReducer::build_shard_pieces() {
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    const int64_t first = comm_->rank() * slice_length(bucket);
    for (std::size_t j = 0; j < bucket.params.size(); ++j) {
      const std::size_t index = bucket.params[j];
      const auto [begin, end] = held_by(index, comm_->rank());
      if (begin == end) continue;
      const int64_t shard_offset = bucket.offsets[j] + begin - first;
      pieces_.push_back({index, b, begin, end - begin, shard_offset});
      // Stage 3: a view of the slice this rank keeps; else of the parameter itself.
      piece_tensors_.push_back(shards_parameters() ? bucket.param_shard.narrow(0, shard_offset, end - begin)
                                                   : params_[index].detach().view(-1).narrow(0, begin, end - begin));
    }
  }
}

ACCELERATE_INLINE void GradientReducer::on_ready(std::size_t index) {
  if (shards_parameters()) unit_progress(index);
  if (announced_sync_ >= 0) {
    const bool announced = announced_sync_ == 1;
    announced_sync_ = -1;  // checked once per backward
    ACCELERATE_CHECK(announced == sync_, "join_uneven_inputs (rank ", comm_->rank(), "): gradient sync was ",
                     announced ? "switched off (no_sync)" : "switched on", " between a forward and its backward; "
                     "inside the scope open no_sync (or accumulate) before the forward, which the ranks that ran "
                     "out of batches follow");
  }
  if (!sync_ && !force_sync_) {
    window_used_[index] = true;
    return;
  }
  if (round_abandoned_) close_abandoned_round();
  if (!round_open_) open_round(/*from_backward=*/true);
  if (ready_[index] && !used_[index]) {
    late_.push_back(names_[index]);  // predicted unused, yet it received a gradient
    return;
  }
  mark_ready(index, /*used=*/true);
}

ACCELERATE_INLINE void GradientReducer::open_round(bool from_backward) {
  round_open_ = true;
  // Runs when this backward pass ends, on the same thread, before backward() returns.
  if (from_backward) at_end_of_backward(&GradientReducer::finish_round, &GradientReducer::round_abandoned_);
  // Sharded: a slice gradient still held from an earlier synchronised backward (sync_each_batch,
  // or no zero_grad since) is a view of the bucket this round overwrites; it is kept apart, and
  // this round's average is added to it, as data parallel's .grad accumulates.
  if (sharded())
    for (auto& piece : piece_tensors_)
      if (piece.grad().defined()) piece.mutable_grad() = piece.grad().clone();
  // Every bucket of a round is compressed, or none (PowerSGD starts after some rounds).
  round_compressed_ = options_.compression != GradientCompression::none &&
                      (options_.compression != GradientCompression::power_sgd ||
                       sync_rounds_ >= options_.power_sgd.start_iteration);
  // What the forward's graph cannot reach is ready now (zeros), not at the end.
  if (!unreachable_.empty())
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (unreachable_[i]) mark_ready(i, /*used=*/false);
}

ACCELERATE_INLINE void GradientReducer::at_end_of_backward(void (GradientReducer::*finish)(),
                                                          std::atomic<bool> GradientReducer::*abandoned) {
  // Owned by the callback: destroyed unrun, it raises the flag.
  struct Pending {
    Pending(std::weak_ptr<GradientReducer> held, std::atomic<bool> GradientReducer::*flag)
        : reducer(std::move(held)), abandoned(flag) {}
    Pending(const Pending&) = delete;
    Pending& operator=(const Pending&) = delete;
    ~Pending() {
      if (ran) return;
      if (auto held = reducer.lock()) ((*held).*abandoned).store(true);
    }
    std::weak_ptr<GradientReducer> reducer;
    std::atomic<bool> GradientReducer::*abandoned;
    bool ran = false;
  };
  auto pending = std::make_shared<Pending>(weak_from_this(), abandoned);
  torch::autograd::Engine::get_default_engine().queue_callback([pending, finish] {
    pending->ran = true;
    if (auto held = pending->reducer.lock()) ((*held).*finish)();
  });
}

ACCELERATE_INLINE void GradientReducer::recover_abandoned_backward() {
  if (round_abandoned_) close_abandoned_round();
  if (units_abandoned_.exchange(false)) {
    units_round_open_ = false;
    for (auto& unit : units_) unit.ready = 0;
    release_units();
  }
}

ACCELERATE_INLINE void GradientReducer::close_abandoned_round() {
  round_abandoned_ = false;
  // The peers' matching collectives were launched too (the same backward failed there), or
  // they fail on their timeout: either way nothing launched here is left to pair with the
  // next round's collectives.
  wait_launched();
  reset_round();
  round_open_ = false;
}

ACCELERATE_INLINE void GradientReducer::unit_progress(std::size_t index) {
  if (!units_round_open_) {
    units_round_open_ = true;
    at_end_of_backward(&GradientReducer::end_units_round, &GradientReducer::units_abandoned_);
  }
  Unit& unit = units_[unit_of_[index]];
  if (++unit.ready == unit.params.size()) release_unit(unit_of_[index]);
}

ACCELERATE_INLINE void GradientReducer::end_units_round() {
  units_round_open_ = false;
  for (auto& unit : units_) unit.ready = 0;
  release_units();
}

ACCELERATE_INLINE void GradientReducer::assign_units() {
  if (!shards_parameters()) return;
  const auto& prefixes = options_.units;
  unit_of_.assign(params_.size(), prefixes.size());
  for (std::size_t i = 0; i < params_.size(); ++i)
    for (std::size_t u = 0; u < prefixes.size(); ++u)
      if (names_[i].rfind(prefixes[u] + ".", 0) == 0) {
        unit_of_[i] = u;
        break;
      }
  units_.assign(prefixes.size() + 1, Unit{});
  for (std::size_t i = 0; i < params_.size(); ++i) units_[unit_of_[i]].params.push_back(i);
}

ACCELERATE_INLINE void GradientReducer::make_accumulator(std::size_t index) {
  accumulators_[index] = torch::autograd::impl::grad_accumulator(params_[index]);
  ACCELERATE_CHECK(accumulators_[index] != nullptr, "GradientReducer: parameter '", names_[index],
                   "' is not a leaf that accumulates gradients");
}

ACCELERATE_INLINE void GradientReducer::shard_parameters() {
  torch::NoGradGuard no_grad;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    units_[unit_of_[bucket.params.front()]].buckets.push_back(b);
    bucket.param_full = at::zeros({bucket.padded}, bucket.options);
    for (std::size_t j = 0; j < bucket.params.size(); ++j) {
      const std::size_t index = bucket.params[j];
      at::Tensor place = bucket.param_full.narrow(0, bucket.offsets[j], numel_[index]);
      if (built_[index].defined()) {
        at::Tensor whole = at::empty({built_[index].numel() * comm_->world_size()}, bucket.options);
        comm_->all_gather_into(whole, built_[index], "stage 3 prepare of parameters cut as they were built");
        place.copy_(whole.narrow(0, 0, numel_[index]));
        built_[index] = at::Tensor();
      } else {
        place.copy_(params_[index].detach().reshape(-1));
      }
      params_[index].set_data(storage_alias(bucket.param_full, bucket.offsets[j], shape_[index]));
      if (!accumulators_[index]) make_accumulator(index);
    }
    const int64_t slice = slice_length(bucket);
    bucket.param_shard = bucket.param_full.narrow(0, comm_->rank() * slice, slice).clone();
    release_bucket(bucket);
  }
  for (auto& unit : units_) unit.state = UnitState::released;
}

ACCELERATE_INLINE void GradientReducer::start_gather(std::size_t unit) {
  if (unit >= units_.size() || units_[unit].state != UnitState::released) return;
  for (const std::size_t b : units_[unit].buckets) {
    Bucket& bucket = buckets_[b];
    compat::allocate_storage(bucket.param_full.storage(), static_cast<std::size_t>(bucket.param_full.nbytes()));
    bucket.gather_work = comm_->all_gather_into_async(bucket.param_full, bucket.param_shard);
  }
  units_[unit].state = UnitState::in_flight;
}

ACCELERATE_INLINE void GradientReducer::mark_ready(std::size_t index, bool used) {
  if (ready_[index]) return;
  ready_[index] = true;
  used_[index] = used;
  // Used earlier in the window: its accumulated .grad is sent, unused in this backward or not.
  used = used || window_used_[index];
  ++ready_count_;
  if (!order_settled_ && options_.bucket_order_from_arrival) arrival_.push_back(index);
  Bucket& bucket = buckets_[bucket_of_[index]];
  at::Tensor& param = params_[index];
  if (!bucket.flat.defined()) {  // sharded gradients: the bucket's buffer lives for this round
    if (used && can_adopt(bucket, param.grad())) {
      // The bucket is this one gradient, exactly: autograd's tensor becomes its buffer, not
      // copied, so the gradient does not exist twice while it is sent (bench/README.md).
      bucket.flat = param.grad().detach().view({-1});
      param.mutable_grad().reset();
      ++adopted_gradients_;
      if (--bucket.pending == 0) launch_ready_buckets();
      return;
    }
    bucket.flat = at::zeros({bucket.padded}, bucket.options);
  }
  at::Tensor slot = bucket_slot(index);
  const bool views = options_.gradient_as_bucket_view;
  const at::Tensor& grad = param.grad();
  if (used && grad.defined()) {
    if (!views || !is_view_of(grad, slot, param)) {
      slot.copy_(grad.reshape(-1));
      // The gradient autograd made is freed; backward accumulates into the bucket from now.
      if (views) param.mutable_grad() = bucket_view(index);
    }
  } else {
    // The bucket sends zeros for it; a locally accumulated .grad keeps its value apart
    // (kept if no rank used it, replaced by the average otherwise, as without views).
    if (views && is_view_of(grad, slot, param)) param.mutable_grad() = grad.clone();
    slot.zero_();
  }
  // Sharded gradients: the bucket holds this gradient now; only the shard will be kept.
  if (scatters()) param.mutable_grad().reset();
  if (--bucket.pending == 0) launch_ready_buckets();
}

ACCELERATE_INLINE void GradientReducer::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& bucket = buckets_[next_bucket_++];
    if (ready_count_ < params_.size()) ++overlapped_launches_;
    if (scatters()) bucket.work = comm_->reduce_scatter_async(bucket.flat, bucket.shard);
    else if (round_compressed_) {
      at::Tensor wire = bucket.compressor.compress(bucket.flat, comm_->world_size());
      bucket.work = comm_->all_reduce_async(wire);
    } else if (ordered_sums_) {
      bucket.work = comm_->gradient_sum_scatter_async(bucket.flat);
      start_exchanges(/*wait=*/false);
    } else {
      bucket.work = comm_->all_reduce_async(bucket.flat);
    }
    // Sharded gradients: the full buffers of at most buckets_in_flight launched buckets
    // stay alive; older ones are awaited and freed while backward goes on (else every
    // bucket's buffer would coexist until the end of backward: the model's whole gradient
    // again, measured in bench/README.md).
    if (!scatters()) continue;
    ++buckets_in_flight_;
    if (next_bucket_ > options_.buckets_in_flight) retire(buckets_[next_bucket_ - options_.buckets_in_flight - 1]);
    peak_buckets_in_flight_ = std::max(peak_buckets_in_flight_, buckets_in_flight_);
  }
}

ACCELERATE_INLINE void GradientReducer::start_exchanges(bool wait) {
  for (; next_exchange_ < next_bucket_; ++next_exchange_) {
    Bucket& bucket = buckets_[next_exchange_];
    if (!wait && !Communicator::done(bucket.work)) return;
    comm_->wait(bucket.work, "gradient all_reduce (reduce-scatter)");
    bucket.work.reset();
    const int tag = kGradientSumTag + static_cast<int>(next_exchange_);
    bucket.exchange = comm_->gradient_sum_gather_async(bucket.flat, tag);
  }
}

ACCELERATE_INLINE void GradientReducer::retire(Bucket& bucket) {
  if (!bucket.work) return;
  comm_->wait(bucket.work, "gradient reduce_scatter");
  bucket.work.reset();
  --buckets_in_flight_;
  bucket.flat.reset();
}

ACCELERATE_INLINE void GradientReducer::finish_round() {
  round_open_ = false;
  if (next_bucket_ < buckets_.size()) {
    std::vector<std::string> missing;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!ready_[i]) missing.push_back(names_[i]);
    if (!options_.find_unused_parameters) {
      std::ostringstream list;
      for (const auto& name : missing) list << ' ' << name;
      // Launched buckets must still complete, or the peers' next collective would mismatch.
      wait_launched();
      reset_round();
      accelerate::detail::fail(
          "gradient sync (rank ", comm_->rank(), "): ", missing.size(),
          " parameter(s) received no gradient in this backward pass, so their buckets can "
          "never be all-reduced:", list.str(),
          ". Use every parameter in forward, freeze them (requires_grad=false), or set "
          "AcceleratorOptions::ddp.find_unused_parameters = true");
    }
    for (std::size_t i = 0; i < params_.size(); ++i) mark_ready(i, /*used=*/false);  // zeros
  }
  if (!late_.empty()) {
    std::ostringstream list;
    for (const auto& name : late_) list << ' ' << name;
    wait_launched();
    reset_round();
    accelerate::detail::fail("gradient sync (rank ", comm_->rank(), "): parameter(s)", list.str(),
                             " received a gradient although the model's output does not depend on "
                             "them (used outside the prepared model's forward?); with "
                             "find_unused_parameters every parameter's gradient must come through "
                             "the model's output");
  }
  // Which parameters received a gradient on some rank (DDP's unused-parameter bitmap).
  at::Tensor used_anywhere;
  if (options_.find_unused_parameters) {
    used_anywhere = at::empty({static_cast<int64_t>(params_.size())}, at::TensorOptions().dtype(at::kInt));
    int* flags = used_anywhere.data_ptr<int>();
    for (std::size_t i = 0; i < params_.size(); ++i) flags[i] = used_[i] || window_used_[i] ? 1 : 0;
    used_anywhere = used_anywhere.to(params_.front().device());  // NCCL takes device tensors
    comm_->all_reduce(used_anywhere, Reduction::max);
    used_anywhere = used_anywhere.cpu();
  }
  const int* used_flags = used_anywhere.defined() ? used_anywhere.data_ptr<int>() : nullptr;
  torch::NoGradGuard no_grad;
  if (scatters()) {
    for (auto& bucket : buckets_) {
      retire(bucket);  // the full buffer lives for one round at most
      bucket.shard.div_(comm_->world_size());
    }
    for (std::size_t k = 0; k < pieces_.size(); ++k) {
      if (used_flags && used_flags[pieces_[k].param] == 0) continue;  // unused everywhere: as it was
      add_to_slice_gradient(k, storage_alias(buckets_[pieces_[k].bucket].shard, pieces_[k].shard_offset,
                                             pieces_[k].length));
    }
    comm_->count_grad_sync_round();
    reset_round();
    return;
  }
  // The average is over the ranks that contributed (all, unless some ran out under join).
  const int world = divisor_ > 0 ? divisor_ : comm_->world_size();
  if (ordered_sums_ && !round_compressed_) start_exchanges(/*wait=*/true);
  for (auto& bucket : buckets_) {
    for (const auto& part : bucket.exchange) comm_->wait(part, "gradient all_reduce (slice exchange)");
    bucket.exchange.clear();
    if (bucket.work) comm_->wait(bucket.work, "gradient all_reduce");
    if (!round_compressed_) {
      bucket.flat.div_(world);
      continue;
    }
    // Compressed: the average comes back; PowerSGD's second factor is summed next, each
    // bucket's launched before the next bucket is waited for.
    bucket.second = bucket.compressor.decompress(bucket.flat, world);
    if (bucket.second.defined()) bucket.second_work = comm_->all_reduce_async(bucket.second);
  }
  for (auto& bucket : buckets_) {
    if (!bucket.second_work) continue;
    comm_->wait(bucket.second_work, "gradient all_reduce (PowerSGD's second factor)");
    bucket.compressor.finish(bucket.flat, world);
  }
  for (std::size_t index = 0; index < params_.size() && !sharded(); ++index) {
    if (used_flags && used_flags[index] == 0) continue;  // unused everywhere: .grad untouched
    at::Tensor& param = params_[index];
    const at::Tensor slot = bucket_slot(index);
    at::Tensor& grad = param.mutable_grad();
    if (options_.gradient_as_bucket_view) {
      if (!is_view_of(grad, slot, param)) grad = bucket_view(index);
    } else if (grad.defined()) {
      grad.copy_(slot.view(param.sizes()));
    } else {
      grad = slot.view(param.sizes()).clone();
    }
  }
  if (sharded()) {
    // Sharded optimizer state: each rank keeps only its slices, views of the averaged
    // buckets (which persist), and releases the parameters' .grad, so the next window
    // accumulates from zero. (Views of the parameters' .grad would keep every one a slice
    // touches alive: up to twice the gradient memory, measured by estimate_memory's test.)
    for (std::size_t k = 0; k < pieces_.size(); ++k) {
      const ShardPiece& piece = pieces_[k];
      if (used_flags && used_flags[piece.param] == 0) {  // unused everywhere: the local .grad, if any
        const at::Tensor& local = params_[piece.param].grad();
        if (local.defined()) add_to_slice_gradient(k, storage_alias(local.contiguous(), piece.begin, piece.length));
      } else {
        const Bucket& bucket = buckets_[bucket_of_[piece.param]];
        add_to_slice_gradient(
            k, storage_alias(bucket.flat, bucket.offsets[position_of_[piece.param]] + piece.begin, piece.length));
      }
    }
    for (auto& param : params_) param.mutable_grad().reset();
  }
  if (!order_settled_ && options_.bucket_order_from_arrival) rebuild_in_arrival_order();
  ++sync_rounds_;
  comm_->count_grad_sync_round();
  reset_round();
}

ACCELERATE_INLINE void GradientReducer::add_to_slice_gradient(std::size_t piece, const at::Tensor& average) {
  at::Tensor& grad = piece_tensors_[piece].mutable_grad();
  if (grad.defined()) grad.add_(average);  // kept apart by open_round
  else grad = average;
}

ACCELERATE_INLINE void GradientReducer::rebuild_in_arrival_order() {
  order_settled_ = true;
  at::Tensor order = at::empty({static_cast<int64_t>(params_.size())}, at::TensorOptions().dtype(at::kLong));
  auto* mine = order.data_ptr<int64_t>();
  const bool complete = arrival_.size() == params_.size();
  for (std::size_t k = 0; k < params_.size(); ++k) mine[k] = complete ? static_cast<int64_t>(arrival_[k]) : -1;
  order = order.to(params_.front().device());  // NCCL takes device tensors
  comm_->broadcast(order, 0);
  order = order.cpu();
  const int64_t* received = order.data_ptr<int64_t>();
  const auto arrival = parameter_order(std::vector<int64_t>(received, received + order.numel()));
  if (arrival) relayout(*arrival);  // else rank 0 saw no complete order: keep the layout
}

ACCELERATE_INLINE std::optional<std::vector<std::size_t>> GradientReducer::parameter_order(
    const std::vector<int64_t>& order) const {
  if (order.size() != params_.size()) return std::nullopt;
  std::vector<bool> seen(params_.size(), false);
  std::vector<std::size_t> indices;
  indices.reserve(order.size());
  for (const int64_t index : order) {
    if (index < 0 || index >= static_cast<int64_t>(params_.size()) || seen[static_cast<std::size_t>(index)])
      return std::nullopt;
    seen[static_cast<std::size_t>(index)] = true;
    indices.push_back(static_cast<std::size_t>(index));
  }
  return indices;
}

ACCELERATE_INLINE void GradientReducer::relayout(const std::vector<std::size_t>& order) {
  if (order == launch_order()) return;
  std::vector<at::Tensor> moved(params_.size());  // views of the old buckets, kept alive
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (is_view_of(params_[i].grad(), bucket_slot(i), params_[i])) moved[i] = params_[i].grad();
  torch::NoGradGuard no_grad;
  build_buckets(order);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!moved[i].defined()) continue;
    bucket_slot(i).copy_(moved[i].reshape(-1));
    params_[i].mutable_grad() = bucket_view(i);
  }
}

ACCELERATE_INLINE void GradientReducer::wait_launched() {
  const auto quietly = [](const InFlight& work) {
    try {
      if (work) work.work->wait();
    } catch (...) {
    }
  };
  for (std::size_t b = 0; b < next_bucket_; ++b) {
    quietly(buckets_[b].work);  // none when retired already
    for (const auto& part : buckets_[b].exchange) quietly(part);
  }
}

ACCELERATE_INLINE void GradientReducer::reset_round() {
  divisor_ = 0;
  buckets_in_flight_ = 0;
  force_sync_ = false;
  next_bucket_ = 0;
  next_exchange_ = 0;
  ready_count_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  std::fill(used_.begin(), used_.end(), false);
  std::fill(window_used_.begin(), window_used_.end(), false);
  unreachable_.clear();  // a prediction holds for the one backward after its forward
  late_.clear();
  arrival_.clear();
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.params.size();
    bucket.work.reset();
    bucket.exchange.clear();
    bucket.second_work.reset();
    bucket.second = at::Tensor();
    if (scatters()) bucket.flat.reset();
  }
}

}  // namespace accelerate::distributed
