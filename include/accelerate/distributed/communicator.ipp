// Bodies of communicator.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/distributed/communicator.hpp>

namespace accelerate::distributed {

ACCELERATE_INLINE void InFlight::reset() noexcept {
  work.reset();
  finished.reset();
  complete = nullptr;
}

ACCELERATE_INLINE void Communicator::all_reduce(at::Tensor& tensor, Reduction reduction) {
  const Reduction sent = reduction == Reduction::mean ? Reduction::sum : reduction;
  agree(CollectiveOp::all_reduce, &tensor, static_cast<std::int64_t>(sent));
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = to_reduce_op(sent);
  wait(start(backend_->allreduce(tensors, options)), "all_reduce");
  count(stats_.allreduce, tensor);
  if (reduction == Reduction::mean) divide_by_world(tensor);
}

ACCELERATE_INLINE InFlight Communicator::all_reduce_async(at::Tensor& tensor) {
  agree(CollectiveOp::all_reduce, &tensor, static_cast<std::int64_t>(Reduction::sum));
  std::vector<at::Tensor> tensors{tensor};
  InFlight work = start(backend_->allreduce(tensors));
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.allreduce.add(bytes(tensor));
  stats_.gradient_allreduce.add(bytes(tensor));
  return work;
}

ACCELERATE_INLINE void Communicator::broadcast(at::Tensor& tensor, int root) {
  agree(CollectiveOp::broadcast, &tensor, root);
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  wait(start(backend_->broadcast(tensors, options)), "broadcast");
  count(stats_.broadcast, tensor);
}

ACCELERATE_INLINE std::vector<at::Tensor> Communicator::all_gather(const at::Tensor& tensor) {
  at::Tensor input = tensor.contiguous();
  agree(CollectiveOp::all_gather, &input, 0);
  std::vector<at::Tensor> inputs{input};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < world_size_; ++r) outputs[0].push_back(at::empty_like(input));
  wait(start(backend_->allgather(outputs, inputs)), "all_gather");
  count(stats_.allgather, input);
  return outputs[0];
}

ACCELERATE_INLINE at::Tensor Communicator::reduce_scatter(const at::Tensor& tensor, Reduction reduction) {
  ACCELERATE_CHECK(tensor.dim() > 0 && tensor.size(0) % world_size_ == 0, "reduce_scatter: dimension 0 of a "
                   "tensor of shape ", tensor.sizes(), " does not split into ", world_size_, " equal slices");
  at::Tensor input = tensor.contiguous();
  const Reduction sent = reduction == Reduction::mean ? Reduction::sum : reduction;
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end());
  shape[0] /= world_size_;
  at::Tensor output = at::empty(shape, input.options());
  wait(reduce_scatter_async(input, output, sent), "reduce_scatter");
  if (reduction == Reduction::mean) divide_by_world(output);
  return output;
}

ACCELERATE_INLINE InFlight Communicator::reduce_scatter_async(
    at::Tensor& input, at::Tensor& output, Reduction reduction) {
  ACCELERATE_CHECK(reduction != Reduction::mean, "reduce_scatter_async: reduce with sum and divide the result");
  agree(CollectiveOp::reduce_scatter, &input, static_cast<std::int64_t>(reduction));
  count(stats_.reduce_scatter, input);
  return start_reduce_scatter(input, output, reduction);
}

ACCELERATE_INLINE InFlight Communicator::gradient_sum_scatter_async(at::Tensor& bucket) {
  agree(CollectiveOp::reduce_scatter, &bucket, static_cast<std::int64_t>(Reduction::sum));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.allreduce.add(bytes(bucket));
    stats_.gradient_allreduce.add(bytes(bucket));
  }
  at::Tensor mine = own_slice(bucket, rank_);  // the all-to-all has read `bucket` when the sum is written
  return start_reduce_scatter(bucket, mine, Reduction::sum);
}

ACCELERATE_INLINE std::vector<InFlight> Communicator::gradient_sum_gather_async(at::Tensor& bucket, int tag) {
  std::vector<InFlight> works;
  at::Tensor mine = own_slice(bucket, rank_);
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    std::vector<at::Tensor> sent{mine};
    works.push_back(start(backend_->send(sent, peer, tag)));
    std::vector<at::Tensor> received{own_slice(bucket, peer)};
    works.push_back(start(backend_->recv(received, peer, tag)));
  }
  return works;
}

ACCELERATE_INLINE InFlight Communicator::all_gather_into_async(at::Tensor& output, at::Tensor& input) {
  agree(CollectiveOp::all_gather, &input, 0);
  InFlight work = start(backend_->_allgather_base(output, input));
  count(stats_.allgather, input);
  return work;
}

ACCELERATE_INLINE InFlight Communicator::send_async(at::Tensor& tensor, int to, int tag) {
  ACCELERATE_CHECK(tensor.is_contiguous() && to >= 0 && to < world_size_ && to != rank_, "send: rank ", rank_,
                   " cannot send a ", tensor.is_contiguous() ? "" : "non-contiguous ", "tensor to rank ", to);
  std::vector<at::Tensor> tensors{tensor};
  InFlight work = start(backend_->send(tensors, to, tag));
  count(stats_.point_to_point, tensor);
  return work;
}

ACCELERATE_INLINE InFlight Communicator::recv_async(at::Tensor& tensor, int from, int tag) {
  ACCELERATE_CHECK(tensor.is_contiguous() && from >= 0 && from < world_size_ && from != rank_, "recv: rank ",
                   rank_, " cannot receive into a ", tensor.is_contiguous() ? "" : "non-contiguous ",
                   "tensor from rank ", from);
  std::vector<at::Tensor> tensors{tensor};
  return start(backend_->recv(tensors, from, tag));
}

ACCELERATE_INLINE void Communicator::barrier() {
  agree(CollectiveOp::barrier, nullptr, 0);
  wait(start(backend_->barrier()), "barrier");
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.barrier.add(0);
}

ACCELERATE_INLINE void Communicator::wait(const InFlight& work, const char* what) {
  const auto blocked = std::chrono::steady_clock::now();
  try {
    work.work->wait();
  } catch (const std::exception& e) {
    const std::string cause = diagnose_ ? diagnose_() : "a peer exited or timed out";
    accelerate::detail::fail(what, " failed on rank ", rank_, " of ", world_size_, ": ", cause,
                             " (", e.what(), ")");
  }
  if (work.complete) work.complete();
  const auto now = std::chrono::steady_clock::now();
  // Done, but its completion callback may not have run yet: then it completed by now.
  stamp(*work.finished, now);
  const std::chrono::steady_clock::time_point finished{std::chrono::steady_clock::duration(work.finished->load())};
  std::lock_guard<std::mutex> lock(mutex_);
  const CommTime spent = busy_since(work.started, std::min(finished, now), now - blocked);
  stats_.time += spent;
}

ACCELERATE_INLINE void Communicator::count_grad_sync_round() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.grad_sync_rounds;
  stats_.last_step = stats_.time - step_started_;
  step_started_ = stats_.time;
}

ACCELERATE_INLINE InFlight Communicator::start(compat::WorkPtr work) {
  InFlight flight{std::move(work), std::chrono::steady_clock::now(),
                  std::make_shared<std::atomic<std::chrono::steady_clock::rep>>(0)};
  try {
    flight.work->getFuture()->addCallback([finished = flight.finished](c10::ivalue::Future&) {
      stamp(*finished, std::chrono::steady_clock::now());
    });
  } catch (const c10::Error&) {
    // A backend without futures: the end of the wait stands for the completion.
  }
  return flight;
}

ACCELERATE_INLINE InFlight Communicator::start_reduce_scatter(
    at::Tensor& input, at::Tensor& output, Reduction reduction) {
  if (reduction == Reduction::sum && input.scalar_type() != at::kBool && sums_in_rank_order()) {
    at::Tensor received = at::empty_like(input, at::MemoryFormat::Contiguous);
    std::vector<int64_t> equal_splits;
    InFlight work = start(backend_->alltoall_base(received, input, equal_splits, equal_splits));
    work.complete = [received, output, world = world_size_]() mutable {
      at::NoGradGuard no_grad;
      const auto slices = received.chunk(world, 0);
      if (world == 1) output.copy_(slices[0]);
      else at::add_out(output, slices[0], slices[1]);  // the first sum written, not copied then added
      for (int r = 2; r < world; ++r) output.add_(slices[static_cast<std::size_t>(r)]);
    };
    return work;
  }
  c10d::ReduceScatterOptions options;
  options.reduceOp = to_reduce_op(reduction);
  return start(backend_->_reduce_scatter_base(output, input, options));
}

ACCELERATE_INLINE CommTime Communicator::busy_since(std::chrono::steady_clock::time_point started,
                                                    std::chrono::steady_clock::time_point finished,
                                                    std::chrono::steady_clock::duration blocked) {
  const auto from = std::max(started, busy_until_);
  CommTime spent;
  if (finished > from) spent.busy_seconds = std::chrono::duration<double>(finished - from).count();
  busy_until_ = std::max(busy_until_, finished);
  spent.exposed_seconds = std::chrono::duration<double>(blocked).count();
  return spent;
}

ACCELERATE_INLINE c10d::ReduceOp Communicator::to_reduce_op(Reduction reduction) {
  return reduction == Reduction::max   ? c10d::ReduceOp::MAX
         : reduction == Reduction::min ? c10d::ReduceOp::MIN
                                       : c10d::ReduceOp::SUM;  // mean: a sum, then divided
}

ACCELERATE_INLINE const char* Communicator::op_name(std::int64_t op) {
  switch (static_cast<CollectiveOp>(op)) {
    case CollectiveOp::all_reduce: return "all_reduce";
    case CollectiveOp::broadcast: return "broadcast";
    case CollectiveOp::all_gather: return "all_gather";
    case CollectiveOp::barrier: return "barrier";
    case CollectiveOp::reduce_scatter: return "reduce_scatter";
  }
  return "an unknown collective";
}

ACCELERATE_INLINE std::string Communicator::describe(const std::int64_t* d) {
  std::string out = op_name(d[0]);
  if (static_cast<CollectiveOp>(d[0]) == CollectiveOp::barrier) return out;
  out += " of " + std::to_string(d[2]) + " " + c10::toString(static_cast<at::ScalarType>(d[1])) + " elements";
  if (static_cast<CollectiveOp>(d[0]) == CollectiveOp::broadcast) out += " from rank " + std::to_string(d[3]);
  else if (static_cast<CollectiveOp>(d[0]) == CollectiveOp::all_reduce ||
           static_cast<CollectiveOp>(d[0]) == CollectiveOp::reduce_scatter)
    out += " (reduction " + std::to_string(d[3]) + ")";
  return out;
}

ACCELERATE_INLINE void Communicator::agree(CollectiveOp op, const at::Tensor* t, std::int64_t argument) {
  if (!verify_) return;
  const std::int64_t call = verified_calls_++;
  const std::int64_t dtype = t ? static_cast<std::int64_t>(t->scalar_type()) : 0;
  at::Tensor mine =
      at::tensor({static_cast<std::int64_t>(op), dtype, t ? t->numel() : 0, argument, call}, at::kLong)
          .to(verify_device_);
  std::vector<at::Tensor> inputs{mine};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < world_size_; ++r) outputs[0].push_back(at::empty_like(mine));
  wait(start(backend_->allgather(outputs, inputs)), "collective verification");
  std::vector<at::Tensor> all;
  for (auto& o : outputs[0]) all.push_back(o.cpu());
  const auto* first = all[0].data_ptr<std::int64_t>();
  for (int r = 1; r < world_size_; ++r) {
    const auto* theirs = all[static_cast<std::size_t>(r)].data_ptr<std::int64_t>();
    if (std::equal(first, first + 5, theirs)) continue;
    accelerate::detail::fail("collective mismatch (ProcessGroupOptions::verify_collectives): rank 0 calls ",
                             describe(first), " as its collective ", first[4], ", but rank ", r, " calls ",
                             describe(theirs), " as its collective ", theirs[4],
                             "; every rank must make the same collectives, with the same sizes, in the "
                             "same order (seen on rank ", rank_, ")");
  }
}

ACCELERATE_INLINE void broadcast_flat(Communicator& comm, const std::vector<at::Tensor>& tensors, int root,
                                      std::size_t piece_bytes) {
  torch::NoGradGuard no_grad;
  std::map<int, std::vector<at::Tensor>> by_dtype;
  for (const auto& t : tensors) by_dtype[static_cast<int>(t.scalar_type())].push_back(t);
  auto send = [&](const std::vector<at::Tensor>& piece) {
    if (piece.size() == 1 && piece.front().is_contiguous()) {
      at::Tensor whole = piece.front().detach();
      comm.broadcast(whole, root);
      return;
    }
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : piece) flat_parts.push_back(t.detach().reshape(-1));
    at::Tensor flat = at::cat(flat_parts);
    comm.broadcast(flat, root);
    int64_t offset = 0;
    for (const auto& t : piece) {
      t.detach().copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  };
  for (auto& [dtype, group] : by_dtype) {
    std::vector<at::Tensor> piece;
    std::size_t bytes = 0;
    for (const auto& t : group) {
      if (t.numel() == 0) continue;  // nothing to receive
      const auto size = static_cast<std::size_t>(t.numel()) * t.element_size();
      if (!piece.empty() && bytes + size > piece_bytes) {
        send(piece);
        piece.clear();
        bytes = 0;
      }
      piece.push_back(t);
      bytes += size;
    }
    if (!piece.empty()) send(piece);
  }
}

}  // namespace accelerate::distributed
