// GradientReducer: data-parallel gradient averaging in buckets, launched asynchronously from
// autograd hooks as each bucket's gradients become ready, so communication overlaps the rest
// of backward; everything is awaited in a callback at the end of the same backward pass.
//
// Why not c10d::Reducer: it is an internal class whose constructor changed across 2.x
// releases and which drags in dist-autograd headers; this is the same algorithm (bucket
// views, rebuilt bucket order, compression) on public autograd API, measured as fast
// (bench/README.md, "Gradient synchronisation on 2 ranks"). docs/communication.md explains it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <accelerate/compat/torch.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/distributed/bucket_layout.hpp>
#include <accelerate/distributed/bucket_reduction.hpp>
#include <accelerate/distributed/communicator.hpp>
#include <accelerate/distributed/end_of_backward.hpp>
#include <accelerate/distributed/parameter_units.hpp>
#include <accelerate/options.hpp>

namespace accelerate::distributed {

class JoinContext;

/// What a reducer leaves on each rank once a backward pass is synchronised.
enum class Sharding {
  /// Data parallel: every parameter's .grad holds the average (PyTorch DDP).
  none,
  /// ZeRO stage 1: buckets are all-reduced as with `none`, then each rank keeps only the
  /// gradients of its shard, on its shard pieces (shard_pieces()); the parameters' .grad are
  /// released.
  optimizer_state,
  /// ZeRO stage 2: buckets are reduce-scattered, so each rank receives only its shard's
  /// average; each parameter's .grad is released as soon as it is copied into its bucket, and
  /// a bucket's full buffer lives only while its reduce-scatter runs.
  gradients,
  /// ZeRO stage 3: as `gradients`, and the parameters are sharded too, held by a
  /// ParameterUnits (ReducerOptions::units): each bucket's parameters are views of one flat
  /// buffer whose storage is freed between uses; rank r keeps only its slice
  /// (shard_piece_tensors() are views of it).
  parameters,
};

/// What a reducer is built with: the data-parallel options (AcceleratorOptions::ddp, where
/// each is documented: bucket sizes, unused parameters, bucket views, arrival order, rank-order
/// sums, compression, stage 3's buckets in flight), the sharding, and stage 3's parameter
/// store. Arrival order and compression apply to
/// Sharding::none (a sharded optimizer's slices are cut from the bucket layout once, at
/// prepare); views to Sharding::none and optimizer_state, whose buckets persist (stage 2's live
/// only while their reduce-scatter runs).
struct ReducerOptions {
  DdpOptions ddp{};
  Sharding sharding = Sharding::none;
  /// Sharding::parameters (and only then): where the parameters live between their uses,
  /// owned with the sharded engine. The buckets are laid out by its units (never spanning
  /// two), it cuts the parameters along them, and it hears of each gradient as it comes in.
  std::shared_ptr<ParameterUnits> units = {};
};

/// Where one parameter meets this rank's shard of its bucket: `length` elements from element
/// `begin` of the flattened parameter, at `shard_offset` in the bucket's shard.
struct ShardPiece {
  std::size_t param;    // index in the reducer's parameters()
  std::size_t bucket;   // index in bucket_layout()
  int64_t begin;
  int64_t length;
  int64_t shard_offset;
};

/// Averages the gradients of a model's parameters across ranks. Buckets are filled in reverse
/// registration order (roughly the order backward produces gradients), one dtype and device
/// per bucket, and launched strictly in order so every rank issues the same collectives.
/// With sync off (no_sync), hooks return at once and gradients accumulate locally.
///
/// Unused parameters (find_unused_parameters), as PyTorch DDP: after the prepared model's
/// forward, the autograd graph of its outputs is walked once (expect_gradients_from), and the
/// parameters it cannot reach count as ready at once, so their buckets launch with the
/// others instead of waiting for the end of backward. Each step the ranks all-reduce a bitmap
/// of the parameters that really received a gradient: one unused on every rank keeps its
/// .grad untouched (undefined stays undefined, so momentum and weight decay leave it alone);
/// one used anywhere gets the average, the unused ranks contributing zeros.
///
/// Gradients as bucket views (gradient_as_bucket_view), as PyTorch DDP: each .grad aliases
/// its slot of the bucket, so backward accumulates into the bucket, the all-reduce averages in
/// place and nothing is copied back. A .grad that is not the view when its hook runs (new
/// after zero_grad's set_to_none, or assigned by the user) is copied into the slot and
/// replaced by the view.
///
/// Arrival order (bucket_order_from_arrival), as PyTorch DDP: the first synchronised backward
/// records the order in which gradients become ready; rank 0's order is broadcast and the
/// buckets rebuilt in it, so each bucket fills, and launches, as early as backward allows.
///
/// How a full bucket is summed (all-reduce, rank-ordered sum, compressed, reduce-scatter) is
/// a BucketReduction chosen once at construction (bucket_reduction.hpp); where parameters sit
/// in buckets is a BucketLayout (bucket_layout.hpp). This class is the round: hooks, readiness,
/// unused parameters, views, and what each rank is left with.
///
/// Sharded (ReducerOptions::sharding), as ZeRO and Megatron's distributed optimizer: each
/// bucket's flattened parameters are padded to a multiple of the world size and rank r owns
/// the r-th contiguous slice of every bucket, so a bucket's reduce-scatter hands each rank
/// exactly its slice. A parameter meets a rank's slice in at most one ShardPiece; the
/// piece's tensor (shard_piece_tensors()) is a 1-D view of the parameter's own storage, which
/// an optimizer steps in place before gather_parameters() all-gathers the bucket. With
/// Sharding::parameters it is a view of the slice the rank keeps instead, and the parameters
/// are gathered unit by unit when forward and backward need them (ParameterUnits).
class GradientReducer : public std::enable_shared_from_this<GradientReducer> {
 public:
  GradientReducer(std::vector<std::pair<std::string, at::Tensor>> named_params,
                  std::shared_ptr<Communicator> comm, ReducerOptions options);

  /// Registers the hooks; call once, after the reducer is owned by a shared_ptr.
  void install_hooks();

  ~GradientReducer() {
    for (auto& [accumulator, key] : hooks_) accumulator->del_post_hook(key);
  }
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  /// Whether backward passes communicate (false inside no_sync / accumulation micro-steps).
  void set_sync(bool enabled) noexcept { sync_ = enabled; }
  bool sync_enabled() const noexcept { return sync_; }

  /// Under join_uneven_inputs: the next backward's gradients are averaged over `ranks`
  /// processes (those still training; the others send zeros), and it synchronises even off an
  /// accumulation boundary when `force_sync` (another rank's boundary: averaging is
  /// idempotent, so the window's result is unchanged).
  void prepare_joined_round(int ranks, bool force_sync) noexcept {
    divisor_ = ranks;
    force_sync_ = force_sync;
  }
  /// Under join_uneven_inputs: this rank announced its forward with sync `enabled`; a backward
  /// whose sync differs (no_sync opened or closed between the two) is an error, since the
  /// ranks that ran out shadow what was announced.
  void expect_sync_as_announced(bool enabled) noexcept { announced_sync_ = enabled ? 1 : 0; }
  /// A rank that ran out of batches matches one synchronised backward of the others: every
  /// bucket goes out as zeros, in the same collectives (compressed, with the unused-parameter
  /// bitmap, the arrival-order broadcast), averaged over `ranks`.
  void shadow_round(int ranks);
  /// The join_uneven_inputs scope this model is part of (null outside one) and its index there.
  void set_join(std::shared_ptr<JoinContext> join, std::size_t index) noexcept {
    join_ = std::move(join);
    join_index_ = index;
    announced_sync_ = -1;
  }
  const std::shared_ptr<JoinContext>& join() const noexcept { return join_; }
  std::size_t join_index() const noexcept { return join_index_; }

  bool finds_unused_parameters() const noexcept { return options_.ddp.find_unused_parameters; }

  /// Called after a forward pass with its outputs (find_unused_parameters only): the
  /// parameters their autograd graph cannot reach will get no gradient in this backward.
  void expect_gradients_from(const std::vector<at::Tensor>& outputs);

  /// Bucket layout: parameter indices per bucket, in launch order (for tests and benchmarks).
  std::vector<std::vector<std::size_t>> bucket_layout() const;
  std::size_t bucket_count() const noexcept { return layout_.size(); }
  /// The bucket of parameter `index` (an index in parameters()).
  std::size_t bucket_of(std::size_t index) const { return layout_.bucket_of(index); }
  /// Where the parameters sit in buckets, and how a full bucket is summed.
  const BucketLayout& layout() const noexcept { return layout_; }
  const BucketReduction& reduction() const noexcept { return *reduction_; }
  /// Buckets launched while some gradient of the same backward pass was still to come: the
  /// communication that overlapped computation, counted over the reducer's life.
  std::size_t overlapped_launches() const noexcept { return overlapped_launches_; }
  /// Sharded gradients: gradients that became their bucket's buffer instead of being copied
  /// into it (a bucket of one parameter whose length the world size divides), over the
  /// reducer's life.
  std::size_t adopted_gradients() const noexcept { return adopted_gradients_; }
  /// Sharded gradients: the most launched buckets whose full buffers were alive at once while
  /// backward went on (at most ReducerOptions::buckets_in_flight), over the reducer's life.
  std::size_t peak_buckets_in_flight() const noexcept {
    const auto* scattered = dynamic_cast<const ScatteredSum*>(reduction_.get());
    return scattered ? scattered->peak_in_flight() : 0;
  }
  /// Whether replicated buckets are summed in rank order (DdpOptions::sum_in_rank_order, in
  /// effect on Gloo with 3 or more ranks).
  bool sums_in_rank_order() const noexcept { return reduction_->sums_in_rank_order(); }
  /// Whether the buckets were rebuilt in arrival order (after the first synchronised backward,
  /// when that order differed from the initial one).
  bool buckets_rebuilt() const { return layout_.launch_order() != layout_.initial_order(); }
  /// What a checkpoint keeps so that a resumed run synchronises exactly as an uninterrupted
  /// one: the number of synchronised rounds (PowerSGD's start_iteration counts them) and,
  /// once settled from arrival, the bucket order (a resumed run would otherwise use the
  /// registration order for its first round, and on 3+ ranks Gloo sums a moved element in
  /// another order). The same on every rank.
  nlohmann::json layout_state() const;

  /// Restores layout_state(): the buckets are rebuilt in the saved order (gradients that are
  /// bucket views move with them). Checked first: a malformed state changes nothing.
  void load_layout_state(const nlohmann::json& state);

  /// Each bucket's compression state (BucketCompressor::state: PowerSGD's Q, this rank's error
  /// feedback, its generator), as "bucket<b>.<name>"; saved beside layout_state(), after which
  /// it is restored (the buckets are those of the layout).
  std::map<std::string, at::Tensor> compression_state() const;

  /// Restores compression_state(); a `saved_world_size` other than this job's (-1: unknown,
  /// taken as the same) starts every bucket's compression afresh on every rank alike. Every
  /// bucket is checked before any changes.
  void load_compression_state(const std::map<std::string, at::Tensor>& saved, int saved_world_size);
  /// Bytes of gradient memory this reducer's model holds: the buckets, the compression state
  /// and every parameter's .grad that is not a view into a bucket (storage counted once).
  std::size_t gradient_memory_bytes() const;

  /// The parameters it synchronises (those requiring gradients) and their names.
  const std::vector<at::Tensor>& parameters() const noexcept { return params_; }
  const std::vector<std::string>& names() const noexcept { return names_; }
  /// Parameter `index`'s shape (stage 3 empties a released parameter; this stays).
  const std::vector<int64_t>& shape_of(std::size_t index) const { return shape_.at(index); }
  int64_t numel_of(std::size_t index) const { return numel_.at(index); }

  /// Sharded: where this rank's slices meet the parameters, and the 1-D views of the
  /// parameters' storage (stage 3: of the rank's parameter slice) they are (same order). After a synchronised backward each view's
  /// .grad holds its slice of the averaged gradient (undefined when the parameter received
  /// none on any rank).
  const std::vector<ShardPiece>& shard_pieces() const noexcept { return pieces_; }
  const std::vector<at::Tensor>& shard_piece_tensors() const noexcept { return piece_tensors_; }

  /// Sharded: the elements [first, second) of parameter `index`, flattened, that rank `rank`
  /// holds (first == second: none). The slices of one parameter are contiguous and in rank
  /// order, and every rank computes every rank's (the layout is the same everywhere).
  std::pair<int64_t, int64_t> held_by(std::size_t index, int rank) const {
    return layout_.held_by(index, rank, comm_->world_size());
  }

  /// Sharded: after this rank stepped its pieces of bucket `bucket`, every rank's slice to
  /// every rank (one all-gather), so the bucket's parameters are whole and equal everywhere.
  /// Collective: every rank calls it for the same buckets in the same order.
  void gather_parameters(std::size_t bucket_index);

  /// After a backward pass that an exception ended (an out-of-memory error, a hook that threw):
  /// its round is closed (the collectives it launched are waited for, so every rank's next
  /// collective pairs with the same one) and, at stage 3, the units it left gathered are
  /// released. The next synchronised backward calls it, and so does every forward before it
  /// gathers anything; nothing happens when no backward was abandoned.
  void recover_abandoned_backward();

 private:
  bool sharded() const noexcept { return options_.sharding != Sharding::none; }
  bool scatters() const noexcept { return reduction_->scatters(); }
  bool shards_parameters() const noexcept { return options_.sharding == Sharding::parameters; }
  int world() const noexcept { return comm_->world_size(); }

  // Called by autograd after a parameter's gradient was accumulated into .grad.
  class ReadyHook : public torch::autograd::FunctionPostHook {
   public:
    ReadyHook(std::weak_ptr<GradientReducer> reducer, std::size_t index)
        : reducer_(std::move(reducer)), index_(index) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list&) override {
      if (auto reducer = reducer_.lock()) reducer->on_ready(index_);
      return outputs;
    }

   private:
    std::weak_ptr<GradientReducer> reducer_;
    std::size_t index_;
  };

  // Buffers for the buckets as layout_ lays them out now (BucketLayout lays out as it is
  // built, so the constructor only allocates).
  void allocate_buckets();

  // Whether sharded bucket `bucket` can take `grad` as its buffer: its only parameter, with no
  // padding, dense and contiguous, of the bucket's dtype and device, and held by nobody else
  // (a tensor the user kept would see the reduce-scatter write into it).
  bool can_adopt(std::size_t bucket, const at::Tensor& grad) const;

  // Parameter i's slot in its bucket's flat tensor (1-D; the bucket must be allocated).
  at::Tensor bucket_slot(std::size_t i) const {
    return buffers_[layout_.bucket_of(i)].flat.narrow(0, layout_.offset_of(i), numel_[i]);
  }
  // Parameter i's slot shaped like the parameter: its .grad with bucket views.
  at::Tensor bucket_view(std::size_t i) const {
    return storage_alias(buffers_[layout_.bucket_of(i)].flat, layout_.offset_of(i), shape_[i]);
  }

  // Whether `grad` is the view of the slot of `param` in its bucket.
  static bool is_view_of(const at::Tensor& grad, const at::Tensor& slot, const at::Tensor& param) {
    return grad.defined() && grad.data_ptr() == slot.data_ptr() && grad.sizes() == param.sizes() &&
           grad.is_contiguous() && grad.scalar_type() == slot.scalar_type();
  }

  // Each parameter's intersection with this rank's slice of its bucket.
  void build_shard_pieces();


  void on_ready(std::size_t index);

  void open_round(bool from_backward);

  // Closes the round a backward that threw left open (recover_abandoned_backward).
  void close_abandoned_round();

  void make_accumulator(std::size_t index);

  // Puts a gradient (zeros when unused or it has none) into its bucket, unless it is its
  // view there already; launches full buckets.
  void mark_ready(std::size_t index, bool used);

  void launch_ready_buckets();

  void finish_round();

  // Sharded: this round's average of slice `piece`'s gradient becomes its .grad, or is added to
  // the one an earlier synchronised round left there.
  void add_to_slice_gradient(std::size_t piece, const at::Tensor& average);

  // Rank 0's arrival order to every rank, and the buckets rebuilt in it; gradients that were
  // views into the old buckets move into the new ones. Collective (one broadcast), in the
  // first synchronised backward of every rank.
  void rebuild_in_arrival_order();

  // The buckets rebuilt in `order` (when it differs from the current one); gradients that are
  // views into the old buckets move into the new ones. Between rounds only.
  void relayout(const std::vector<std::size_t>& order);

  void wait_launched();

  void reset_round();

  std::shared_ptr<Communicator> comm_;
  ReducerOptions options_;
  bool views_ = true;         // .grad are views into the buckets (DdpOptions::gradient_as_bucket_view)
  bool from_arrival_ = true;  // buckets rebuilt in arrival order (DdpOptions::bucket_order_from_arrival)
  std::unique_ptr<BucketReduction> reduction_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_;
  BucketLayout layout_;
  std::vector<BucketBuffers> buffers_;         // per bucket, as layout_
  std::vector<std::size_t> pending_;           // per bucket: gradients still to come this round
  std::vector<std::vector<int64_t>> shape_;  // each parameter's shape and element count (stage 3
  std::vector<int64_t> numel_;               // empties released parameters)
  std::shared_ptr<ParameterUnits> units_;  // stage 3: ReducerOptions::units
  std::vector<bool> ready_;
  std::vector<bool> used_;         // received a gradient in this backward (ready_ and used)
  // Received a gradient in a backward without sync since the last synchronised round (no_sync,
  // accumulation micro-steps): used in the window, so averaged even if unused in its last
  // backward (PyTorch DDP's local_used_map).
  std::vector<bool> window_used_;
  std::vector<bool> unreachable_;  // predicted unused by the last forward; empty: no prediction
  std::vector<std::string> late_;  // predicted unused, yet a gradient came
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // until install_hooks()
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, std::uintptr_t>> hooks_;
  std::vector<ShardPiece> pieces_;          // sharded: this rank's slices
  std::vector<at::Tensor> piece_tensors_;   // sharded: views of the parameters' storage
  std::vector<std::size_t> arrival_;  // the first synchronised backward's order of readiness
  std::size_t next_bucket_ = 0;
  std::size_t ready_count_ = 0;
  std::size_t overlapped_launches_ = 0;
  std::size_t adopted_gradients_ = 0;
  std::size_t sync_rounds_ = 0;
  bool round_open_ = false;
  std::atomic<bool> round_abandoned_{false};  // a backward that opened a round threw
  bool order_settled_ = false;  // the arrival order was looked at (once)
  bool sync_ = true;
  int divisor_ = 0;          // join: ranks averaged over in this round; 0 = all
  int announced_sync_ = -1;  // join: this rank's sync when it announced its last forward; -1 none
  bool force_sync_ = false;  // join: this round synchronises whatever sync_ says
  std::shared_ptr<JoinContext> join_;
  std::size_t join_index_ = 0;
};

}  // namespace accelerate::distributed

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/distributed/reducer.ipp>
#endif
