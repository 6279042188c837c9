// Bodies of reducer.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/distributed/reducer.hpp>

namespace accelerate::distributed {

ACCELERATE_INLINE GradientReducer::GradientReducer(std::vector<std::pair<std::string, at::Tensor>> named_params,
                                                   std::shared_ptr<Communicator> comm, ReducerOptions options)
    : comm_(std::move(comm)), options_(std::move(options)), units_(std::move(options_.units)) {
  ACCELERATE_CHECK((units_ != nullptr) == shards_parameters(),
                   "GradientReducer: a parameter store (ReducerOptions::units) goes with Sharding::parameters, and only there");
  ACCELERATE_CHECK(!sharded() || options_.ddp.compression == GradientCompression::none,
                   "gradient compression (AcceleratorOptions::ddp.compression = ", to_string(options_.ddp.compression),
                   ") works with replicated data parallel only, not with a sharded backend");
  reduction_ = make_bucket_reduction(
      comm_, options_.sharding == Sharding::gradients || options_.sharding == Sharding::parameters, options_.ddp);
  views_ = options_.ddp.gradient_as_bucket_view;
  from_arrival_ = options_.ddp.bucket_order_from_arrival;
  if (sharded()) {
    // Stage 1's .grad become views of the (persistent) buckets while a synchronised backward
    // runs, so each fresh gradient is freed as soon as it is in its bucket: one copy of the
    // gradients instead of two at the peak. Stage 2's buckets are freed after each
    // reduce-scatter, so its gradients cannot live in them.
    if (scatters()) views_ = false;
    from_arrival_ = false;  // the optimizer's slices are cut from this layout
  }
  for (auto& [name, p] : named_params) {
    if (!p.requires_grad()) continue;
    if (sharded())
      ACCELERATE_CHECK(p.is_contiguous(), "sharded gradient sync: parameter '", name,
                       "' is not contiguous, so its shard cannot be a view of it");
    names_.push_back(name);
    params_.push_back(p);
    // A parameter cut as it was built is empty until the store makes it whole.
    const std::vector<int64_t>* built = units_ ? units_->built_shape(p) : nullptr;
    shape_.push_back(built ? *built : std::vector<int64_t>(p.sizes().begin(), p.sizes().end()));
    numel_.push_back(c10::multiply_integers(shape_.back()));
  }
  if (units_) units_->assign(names_);
  std::vector<BucketedParameter> bucketed;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    bucketed.push_back({numel_[i], static_cast<std::size_t>(p.element_size()),
                        {static_cast<int>(p.device().type()), p.device().index(), static_cast<int>(p.scalar_type())},
                        units_ ? units_->unit_of(i) : 0});
  }
  layout_ = BucketLayout(std::move(bucketed), options_.ddp.first_bucket_cap_bytes, options_.ddp.bucket_cap_bytes,
                         sharded() || reduction_->pads() ? world() : 1);
  allocate_buckets();
  // Each parameter's gradient accumulator, made while the parameter is whole: it records
  // the parameter's shape, and stage 3 releases the parameters right away (one cut as it
  // was built gets its own once the store has made it whole).
  accumulators_.resize(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!units_ || units_->built_shape(params_[i]) == nullptr) make_accumulator(i);
  if (units_) {
    std::vector<at::TensorOptions> bucket_options;
    for (const auto& bucket : buffers_) bucket_options.push_back(bucket.options);
    units_->shard(layout_, params_, shape_, bucket_options, comm_, [this](std::size_t i) { make_accumulator(i); });
  }
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
  for (const auto& bucket : layout_.buckets())
    for (const std::size_t index : bucket.params) mark_ready(index, /*used=*/false);
  finish_round();
}

ACCELERATE_INLINE void GradientReducer::expect_gradients_from(const std::vector<at::Tensor>& outputs) {
  unreachable_.clear();
  if (!options_.ddp.find_unused_parameters || !sync_) return;
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
  for (const auto& b : layout_.buckets()) out.push_back(b.params);
  return out;
}

ACCELERATE_INLINE nlohmann::json GradientReducer::layout_state() const {
  nlohmann::json state = {{"sync_rounds", sync_rounds_}, {"order_settled", order_settled_},
                          {"world_size", comm_->world_size()}};
  if (order_settled_) state["bucket_order"] = layout_.launch_order();
  return state;
}

ACCELERATE_INLINE void GradientReducer::load_layout_state(const nlohmann::json& state) {
  ACCELERATE_CHECK(state.is_object() && state.contains("sync_rounds") && state.contains("order_settled") &&
                       state.at("sync_rounds").is_number_unsigned() && state.at("order_settled").is_boolean(),
                   "gradient sync state: expected sync_rounds and order_settled, got ", state.dump());
  const bool settled = state.at("order_settled").get<bool>();
  std::vector<std::size_t> order = layout_.initial_order();
  if (settled) {
    ACCELERATE_CHECK(state.contains("bucket_order") && state.at("bucket_order").is_array(),
                     "gradient sync state: a settled order needs bucket_order, got ", state.dump());
    const auto saved = layout_.order_from(state.at("bucket_order").get<std::vector<std::int64_t>>());
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
  for (std::size_t b = 0; b < layout_.size(); ++b)
    for (auto& [name, tensor] : reduction_->state(b)) saved["bucket" + std::to_string(b) + "." + name] = tensor;
  return saved;
}

ACCELERATE_INLINE void GradientReducer::load_compression_state(
    const std::map<std::string, at::Tensor>& saved, int saved_world_size) {
  std::vector<std::map<std::string, at::Tensor>> per_bucket(layout_.size());
  for (const auto& [key, tensor] : saved) {
    const auto dot = key.find('.');
    std::size_t b = layout_.size();
    if (key.rfind("bucket", 0) == 0 && dot != std::string::npos) {
      try {
        b = std::stoul(key.substr(6, dot - 6));
      } catch (const std::exception&) {
      }
    }
    ACCELERATE_CHECK(b < layout_.size(), "gradient sync state: '", key, "' names no bucket of this model's ",
                     layout_.size());
    per_bucket[b][key.substr(dot + 1)] = tensor;
  }
  for (std::size_t b = 0; b < layout_.size(); ++b) reduction_->check_state(b, per_bucket[b]);
  const bool same_world = saved_world_size < 0 || saved_world_size == world();
  for (std::size_t b = 0; b < layout_.size(); ++b)
    reduction_->load_state(b, per_bucket[b], buffers_[b].options, same_world);
}

ACCELERATE_INLINE std::size_t GradientReducer::gradient_memory_bytes() const {
  std::unordered_set<const void*> seen;
  std::size_t total = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined() && seen.insert(t.storage().data()).second) total += t.storage().nbytes();
  };
  for (const auto& bucket : buffers_) {
    add(bucket.flat);
    add(bucket.shard);
  }
  total += reduction_->state_bytes();
  for (const auto& p : params_) add(p.grad());
  for (const auto& t : piece_tensors_) add(t.grad());
  return total;
}

ACCELERATE_INLINE void GradientReducer::gather_parameters(std::size_t bucket_index) {
  torch::NoGradGuard no_grad;
  const LaidOutBucket& bucket = layout_[bucket_index];
  const int64_t length = layout_.slice_length(bucket_index, world());
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

ACCELERATE_INLINE void GradientReducer::allocate_buckets() {
  buffers_.assign(layout_.size(), BucketBuffers{});
  pending_.assign(layout_.size(), 0);
  for (std::size_t b = 0; b < layout_.size(); ++b) {
    const LaidOutBucket& laid = layout_[b];
    BucketBuffers& bucket = buffers_[b];
    bucket.options = params_[laid.params.back()].options().requires_grad(false);
    // Stage 1 pads the layout (each rank's slice), not the buffer all-reduced.
    if (scatters()) bucket.shard = at::zeros({layout_.slice_length(b, world())}, bucket.options);
    else bucket.flat = at::zeros({reduction_->pads() ? laid.padded : laid.length}, bucket.options);
    pending_[b] = laid.params.size();
  }
  reduction_->lay_out(layout_, shape_, buffers_);
}

ACCELERATE_INLINE bool GradientReducer::can_adopt(std::size_t b, const at::Tensor& grad) const {
  const BucketBuffers& bucket = buffers_[b];
  return scatters() && layout_[b].params.size() == 1 && grad.defined() && grad.layout() == at::kStrided &&
         grad.numel() == layout_[b].padded && grad.is_contiguous() && grad.dtype() == bucket.options.dtype() &&
         grad.device() == bucket.options.device() && grad.use_count() == 1;
}

ACCELERATE_INLINE void GradientReducer::build_shard_pieces() {
  for (std::size_t b = 0; b < layout_.size(); ++b) {
    const LaidOutBucket& bucket = layout_[b];
    const int64_t first = comm_->rank() * layout_.slice_length(b, world());
    for (std::size_t j = 0; j < bucket.params.size(); ++j) {
      const std::size_t index = bucket.params[j];
      const auto [begin, end] = held_by(index, comm_->rank());
      if (begin == end) continue;
      const int64_t shard_offset = bucket.offsets[j] + begin - first;
      pieces_.push_back({index, b, begin, end - begin, shard_offset});
      // Stage 3: a view of the slice this rank keeps; else of the parameter itself.
      piece_tensors_.push_back(units_ ? units_->slice(b).narrow(0, shard_offset, end - begin)
                                      : params_[index].detach().view(-1).narrow(0, begin, end - begin));
    }
  }
}

ACCELERATE_INLINE void GradientReducer::on_ready(std::size_t index) {
  if (units_) units_->gradient_arrived(index);
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
  if (from_backward)
    at_end_of_backward(weak_from_this(), &GradientReducer::finish_round, &GradientReducer::round_abandoned_);
  // Sharded: a slice gradient still held from an earlier synchronised backward (sync_each_batch,
  // or no zero_grad since) is a view of the bucket this round overwrites; it is kept apart, and
  // this round's average is added to it, as data parallel's .grad accumulates.
  if (sharded())
    for (auto& piece : piece_tensors_)
      if (piece.grad().defined()) piece.mutable_grad() = piece.grad().clone();
  reduction_->open_round(sync_rounds_);
  // What the forward's graph cannot reach is ready now (zeros), not at the end.
  if (!unreachable_.empty())
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (unreachable_[i]) mark_ready(i, /*used=*/false);
}

ACCELERATE_INLINE void GradientReducer::recover_abandoned_backward() {
  if (round_abandoned_) close_abandoned_round();
  if (units_) units_->recover_abandoned_backward();
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

ACCELERATE_INLINE void GradientReducer::make_accumulator(std::size_t index) {
  accumulators_[index] = torch::autograd::impl::grad_accumulator(params_[index]);
  ACCELERATE_CHECK(accumulators_[index] != nullptr, "GradientReducer: parameter '", names_[index],
                   "' is not a leaf that accumulates gradients");
}

ACCELERATE_INLINE void GradientReducer::mark_ready(std::size_t index, bool used) {
  if (ready_[index]) return;
  ready_[index] = true;
  used_[index] = used;
  // Used earlier in the window: its accumulated .grad is sent, unused in this backward or not.
  used = used || window_used_[index];
  ++ready_count_;
  if (!order_settled_ && from_arrival_) arrival_.push_back(index);
  const std::size_t b = layout_.bucket_of(index);
  BucketBuffers& bucket = buffers_[b];
  at::Tensor& param = params_[index];
  if (!bucket.flat.defined()) {  // sharded gradients: the bucket's buffer lives for this round
    if (used && can_adopt(b, param.grad())) {
      // The bucket is this one gradient, exactly: autograd's tensor becomes its buffer, not
      // copied, so the gradient does not exist twice while it is sent (bench/README.md).
      bucket.flat = param.grad().detach().view({-1});
      param.mutable_grad().reset();
      ++adopted_gradients_;
      if (--pending_[b] == 0) launch_ready_buckets();
      return;
    }
    bucket.flat = at::zeros({layout_[b].padded}, bucket.options);
  }
  at::Tensor slot = bucket_slot(index);
  const bool views = views_;
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
  if (--pending_[b] == 0) launch_ready_buckets();
}

ACCELERATE_INLINE void GradientReducer::launch_ready_buckets() {
  while (next_bucket_ < layout_.size() && pending_[next_bucket_] == 0) {
    if (ready_count_ < params_.size()) ++overlapped_launches_;
    reduction_->launch(buffers_, next_bucket_++);
  }
}

ACCELERATE_INLINE void GradientReducer::finish_round() {
  round_open_ = false;
  if (next_bucket_ < layout_.size()) {
    std::vector<std::string> missing;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!ready_[i]) missing.push_back(names_[i]);
    if (!options_.ddp.find_unused_parameters) {
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
  if (options_.ddp.find_unused_parameters) {
    used_anywhere = at::empty({static_cast<int64_t>(params_.size())}, at::TensorOptions().dtype(at::kInt));
    int* flags = used_anywhere.data_ptr<int>();
    for (std::size_t i = 0; i < params_.size(); ++i) flags[i] = used_[i] || window_used_[i] ? 1 : 0;
    used_anywhere = used_anywhere.to(params_.front().device());  // NCCL takes device tensors
    comm_->all_reduce(used_anywhere, Reduction::max);
    used_anywhere = used_anywhere.cpu();
  }
  const int* used_flags = used_anywhere.defined() ? used_anywhere.data_ptr<int>() : nullptr;
  torch::NoGradGuard no_grad;
  // The average is over the ranks that contributed (all, unless some ran out under join).
  reduction_->finish(buffers_, divisor_ > 0 ? divisor_ : world());
  if (scatters()) {
    for (std::size_t k = 0; k < pieces_.size(); ++k) {
      if (used_flags && used_flags[pieces_[k].param] == 0) continue;  // unused everywhere: as it was
      add_to_slice_gradient(k, storage_alias(buffers_[pieces_[k].bucket].shard, pieces_[k].shard_offset,
                                             pieces_[k].length));
    }
    comm_->count_grad_sync_round();
    reset_round();
    return;
  }
  for (std::size_t index = 0; index < params_.size() && !sharded(); ++index) {
    if (used_flags && used_flags[index] == 0) continue;  // unused everywhere: .grad untouched
    at::Tensor& param = params_[index];
    const at::Tensor slot = bucket_slot(index);
    at::Tensor& grad = param.mutable_grad();
    if (views_) {
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
        add_to_slice_gradient(k, storage_alias(buffers_[piece.bucket].flat, layout_.offset_of(piece.param) + piece.begin,
                                               piece.length));
      }
    }
    for (auto& param : params_) param.mutable_grad().reset();
  }
  if (!order_settled_ && from_arrival_) rebuild_in_arrival_order();
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
  const auto arrival = layout_.order_from(std::vector<int64_t>(received, received + order.numel()));
  if (arrival) relayout(*arrival);  // else rank 0 saw no complete order: keep the layout
}

ACCELERATE_INLINE void GradientReducer::relayout(const std::vector<std::size_t>& order) {
  if (order == layout_.launch_order()) return;
  std::vector<at::Tensor> moved(params_.size());  // views of the old buckets, kept alive
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (is_view_of(params_[i].grad(), bucket_slot(i), params_[i])) moved[i] = params_[i].grad();
  torch::NoGradGuard no_grad;
  layout_.lay_out(order);
  allocate_buckets();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!moved[i].defined()) continue;
    bucket_slot(i).copy_(moved[i].reshape(-1));
    params_[i].mutable_grad() = bucket_view(i);
  }
}

ACCELERATE_INLINE void GradientReducer::wait_launched() { reduction_->wait_quietly(buffers_, next_bucket_); }

ACCELERATE_INLINE void GradientReducer::reset_round() {
  divisor_ = 0;
  force_sync_ = false;
  next_bucket_ = 0;
  ready_count_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  std::fill(used_.begin(), used_.end(), false);
  std::fill(window_used_.begin(), window_used_.end(), false);
  unreachable_.clear();  // a prediction holds for the one backward after its forward
  late_.clear();
  arrival_.clear();
  for (std::size_t b = 0; b < layout_.size(); ++b) pending_[b] = layout_[b].params.size();
  reduction_->reset_round(buffers_);
}

}  // namespace accelerate::distributed
