// Bodies of join.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/distributed/join.hpp>

namespace accelerate::distributed {

ACCELERATE_INLINE JoinContext::Notice JoinContext::announce_forward(std::size_t model, bool sync) {
  ++forwards_;
  at::Tensor vote = at::zeros({width()}, at::kLong);
  auto* v = vote.data_ptr<int64_t>();
  v[0] = 1;
  v[1] = sync ? 1 : 0;
  v[2 + model] = 1;
  v[2 + static_cast<int64_t>(members_.size()) + comm_->rank()] = 1;
  return read(exchange(vote)).second;
}

ACCELERATE_INLINE int JoinContext::join() {
  for (;;) {
    auto [model, notice] = read(exchange(at::zeros({width()}, at::kLong)));
    if (notice.training_ranks == 0) break;
    Member& member = members_[model];
    if (!member.buffers.empty()) broadcast_flat(*comm_, member.buffers, notice.buffer_root);
    if (notice.sync) member.reducer->shadow_round(notice.divisor);
  }
  return sync_from_last_to_finish();
}

ACCELERATE_INLINE at::Tensor JoinContext::exchange(at::Tensor vote) {
  vote = vote.to(device_);  // NCCL takes device tensors
  comm_->all_reduce(vote, Reduction::sum);
  return vote.cpu();
}

ACCELERATE_INLINE std::pair<std::size_t, JoinContext::Notice> JoinContext::read(const at::Tensor& sum) const {
  const auto* v = sum.data_ptr<int64_t>();
  Notice notice;
  notice.training_ranks = static_cast<int>(v[0]);
  notice.sync = v[1] > 0;
  notice.divisor = divide_by_initial_world_size_ ? comm_->world_size() : notice.training_ranks;
  std::size_t model = 0;
  for (std::size_t m = 0; m < members_.size(); ++m)
    if (v[2 + m] > 0) model = m;
  ACCELERATE_CHECK(notice.training_ranks == 0 || v[2 + model] == notice.training_ranks,
                   "join_uneven_inputs (rank ", comm_->rank(), "): the training ranks ran the forwards of "
                   "different models at the same step; every rank must run the same loop body");
  const auto* ranks = v + 2 + members_.size();
  for (int r = comm_->world_size() - 1; r >= 0; --r)
    if (ranks[r] > 0) notice.buffer_root = r;
  return {model, notice};
}

ACCELERATE_INLINE int JoinContext::sync_from_last_to_finish() {
  at::Tensor counts = at::zeros({comm_->world_size()}, at::kLong);
  counts[comm_->rank()] = static_cast<int64_t>(forwards_);
  counts = counts.to(device_);
  comm_->all_reduce(counts, Reduction::sum);
  counts = counts.cpu();
  const int root = static_cast<int>(counts.argmax().item<int64_t>());  // the first maximum
  for (auto& member : members_) {
    std::vector<at::Tensor> tensors = member.reducer->parameters();
    tensors.insert(tensors.end(), member.buffers.begin(), member.buffers.end());
    broadcast_flat(*comm_, tensors, root);
  }
  return root;
}

}  // namespace accelerate::distributed
