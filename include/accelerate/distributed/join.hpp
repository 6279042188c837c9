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

#include <accelerate/detail/linkage.hpp>
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
/// Gradients are averaged over the ranks that trained in that step (or, with
/// `divide_by_initial_world_size`, summed and divided by the world size); a step synchronises on
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
    int divisor = 0;  // what this step's gradient sum is divided by
  };

  JoinContext(std::shared_ptr<Communicator> comm, std::vector<Member> members, c10::Device device,
              bool divide_by_initial_world_size = false)
      : comm_(std::move(comm)), members_(std::move(members)), device_(device),
        divide_by_initial_world_size_(divide_by_initial_world_size) {}

  /// A training rank, before model `model`'s forward (`sync`: its backward synchronises).
  Notice announce_forward(std::size_t model, bool sync);

  /// This rank ran out of batches: shadows the others' collectives until none trains, then
  /// synchronises every model from the last rank to finish, which it returns.
  int join();

  const std::vector<Member>& members() const noexcept { return members_; }

 private:
  int64_t width() const { return 2 + static_cast<int64_t>(members_.size()) + comm_->world_size(); }

  at::Tensor exchange(at::Tensor vote);

  std::pair<std::size_t, Notice> read(const at::Tensor& sum) const;

  int sync_from_last_to_finish();

  std::shared_ptr<Communicator> comm_;
  std::vector<Member> members_;
  c10::Device device_;
  bool divide_by_initial_world_size_;
  std::size_t forwards_ = 0;  // forwards this rank announced
};

}  // namespace accelerate::distributed

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/distributed/join.ipp>
#endif
