// JoinContext: training on uneven inputs (Accelerate's join_uneven_inputs, torch's Join).
// Ranks still training announce each forward; a rank that ran out shadows their collectives
// until every rank has run out, then the model is synchronised from the last one to finish.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <accelerate/distributed/communicator.hpp>
#include <accelerate/distributed/reducer.hpp>

namespace accelerate::distributed {

/// The models of one join_uneven_inputs scope and what their ranks agree on. The protocol, one
/// all-reduce per forward of a prepared model in the scope (a vector of 2 + M + W integers,
/// summed):
///   - a rank still training adds 1 (the number of ranks training), 1 if this forward's
///     backward synchronises, 1 at the model's slot and 1 at its own rank's slot;
///   - a rank that ran out adds zeros, then shadows what the others do next: rank r's buffer
///     broadcast (r = the lowest rank still training) and, if any of them synchronises, one
///     reducer round of zeros (GradientReducer::shadow_round).
/// Gradients are averaged over the ranks that trained in that step; a step synchronises on
/// every training rank when it does on one. When the sum says no rank trains any more, every
/// rank leaves, and each model's parameters and broadcast buffers are broadcast from the rank
/// that ran the most forwards (the last to run out; the lowest such rank).
class JoinContext {
 public:
  /// One model of the scope: its reducer and the buffers broadcast before its forward.
  struct Member {
    std::shared_ptr<GradientReducer> reducer;
    std::vector<at::Tensor> buffers;
  };
  /// What the training ranks agreed for one forward.
  struct Notice {
    int training_ranks = 0;
    bool sync = false;
    int buffer_root = 0;
  };

  JoinContext(std::shared_ptr<Communicator> comm, std::vector<Member> members, c10::Device device)
      : comm_(std::move(comm)), members_(std::move(members)), device_(device) {}

  /// A training rank, before model `model`'s forward (`sync`: its backward synchronises).
  Notice announce_forward(std::size_t model, bool sync) {
    ++forwards_;
    at::Tensor vote = at::zeros({width()}, at::kLong);
    auto* v = vote.data_ptr<int64_t>();
    v[0] = 1;
    v[1] = sync ? 1 : 0;
    v[2 + model] = 1;
    v[2 + static_cast<int64_t>(members_.size()) + comm_->rank()] = 1;
    return read(exchange(vote)).second;
  }

  /// This rank ran out of batches: shadows the others' collectives until none trains, then
  /// synchronises every model from the last rank to finish, which it returns.
  int join() {
    for (;;) {
      auto [model, notice] = read(exchange(at::zeros({width()}, at::kLong)));
      if (notice.training_ranks == 0) break;
      Member& member = members_[model];
      if (!member.buffers.empty()) broadcast_flat(*comm_, member.buffers, notice.buffer_root);
      if (notice.sync) member.reducer->shadow_round(notice.training_ranks);
    }
    return sync_from_last_to_finish();
  }

  const std::vector<Member>& members() const noexcept { return members_; }

 private:
  int64_t width() const { return 2 + static_cast<int64_t>(members_.size()) + comm_->world_size(); }

  at::Tensor exchange(at::Tensor vote) {
    vote = vote.to(device_);  // NCCL takes device tensors
    comm_->all_reduce(vote, Reduction::sum);
    return vote.cpu();
  }

  std::pair<std::size_t, Notice> read(const at::Tensor& sum) const {
    const auto* v = sum.data_ptr<int64_t>();
    Notice notice;
    notice.training_ranks = static_cast<int>(v[0]);
    notice.sync = v[1] > 0;
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

  int sync_from_last_to_finish() {
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

  std::shared_ptr<Communicator> comm_;
  std::vector<Member> members_;
  c10::Device device_;
  std::size_t forwards_ = 0;  // forwards this rank announced
};

}  // namespace accelerate::distributed
