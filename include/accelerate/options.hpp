// AcceleratorOptions: every run-time knob in one aggregate, written with designated
// initializers and validated once, in the Accelerator's constructor.
#pragma once

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <accelerate/checkpoint/project.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate {

/// Dynamic loss scaling for Fp16 (PyTorch's GradScaler defaults).
/// Example:
///   accelerate::GradScalerOptions{.init_scale = 1024.0, .growth_interval = 100}
struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
};

/// How Accelerator::backward weighs one loss.
struct BackwardOptions {
  /// The loss is a sum over this many items (tokens, say): the window's gradients become the
  /// mean over every item of every micro-step and process (step::ItemWeighting), whatever the
  /// micro-batches hold, instead of a mean of per-micro-batch means. Unset: a mean, divided by
  /// the accumulation window's length as usual.
  std::optional<std::int64_t> num_items;
};

/// How gather_for_metrics gathers (Accelerate's keyword arguments).
/// Example:
///   acc.gather_for_metrics(labels, {.use_gather_object = true});
struct GatherForMetricsOptions {
  /// Gather through gather_object (JSON). Values that are not tensors always are; tensors
  /// cannot be, so true with tensors is an error.
  bool use_gather_object = false;
};

/// What backward() divides the loss by in an accumulation window of N micro-steps.
enum class LossDivisor {
  /// The window's real length: N, or fewer when a prepared dataloader ends the window early,
  /// so that a short final window's gradient is its mean too (the default here).
  window_length,
  /// Always N, as Python Accelerate does: a short final window's gradient is scaled down by
  /// its length / N.
  num_steps,
};

/// Gradient accumulation, read by the Accumulation policy's step state (Accelerate's
/// GradientAccumulationPlugin).
/// Example:
///   Acc acc{{.accumulation = {.num_steps = 8}}};   // with AccumulateDynamic
struct AccumulationOptions {
  /// Micro-steps per optimizer step for AccumulateDynamic. For Accumulate<N> it may be left 0
  /// or must equal N (a mismatch is an error rather than a silent override).
  std::size_t num_steps = 0;
  /// Force a sync (and an optimizer step) on the last batch of a prepared dataloader.
  bool sync_with_dataloader = true;
  /// Communicate gradients on every micro-step, not only on boundaries; the optimizer still
  /// steps only on boundaries (Accelerate's sync_each_batch). Each micro-step's all-reduce
  /// averages what accumulated so far, so no rank holds an un-synchronised window of
  /// gradients; the result is the same as without it (to rounding), for N - 1 more
  /// all-reduces per window.
  bool sync_each_batch = false;
  /// What backward() divides the loss by (see LossDivisor).
  LossDivisor loss_divisor = LossDivisor::window_length;
};

/// Clipping thresholds, read by the Clip policy's step state (the norm type is in ClipNorm<P>).
/// Example:
///   Acc acc{{.clip = {.max_norm = 0.5}}};
struct ClipOptions {
  /// ClipNorm: the largest global gradient norm.
  double max_norm = 1.0;
  /// ClipValue: every gradient element is clamped to [-clip_value, clip_value].
  double clip_value = 1.0;
};

/// Mixed precision, read by the Precision policy's step state and the prepared model
/// (Accelerate's GradScalerKwargs and AutocastKwargs).
/// Example:
///   Acc acc{{.precision = {.grad_scaler = {.init_scale = 1024.0}}}};
struct PrecisionOptions {
  /// Dynamic loss scaling (Fp16 only).
  GradScalerOptions grad_scaler{};
  /// Return the prepared model's floating outputs as fp32 under Bf16/Fp16 (Accelerate's
  /// convert_to_fp32).
  bool convert_outputs_to_fp32 = true;
};

/// The process group every distributed engine builds (Accelerate's InitProcessGroupKwargs).
/// Example:
///   Acc acc{{.process_group = {.timeout = std::chrono::seconds(60)}}};
struct ProcessGroupOptions {
  /// Rendezvous and collective timeout: nothing waits longer than this for a peer.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  /// Check every collective across ranks before it runs (Accelerate's debug mode; also turned
  /// on by ACCELERATE_DEBUG_MODE=1): ranks that call different collectives, or one with
  /// different sizes — a rank in backward while another reduces a metric — get an
  /// accelerate::Error naming both, never a Gloo abort. Costs one small all-gather per
  /// collective. User-facing collectives (gather, reduce, broadcast, pad_across_processes)
  /// always check their tensors, this on or off.
  bool verify_collectives = false;
  /// On Gloo, reduce-scatter (sharded gradients) as an all-to-all: each rank sends every other
  /// rank that rank's slice and adds what it receives, in rank order — half the bytes of
  /// c10d's Gloo reduce-scatter (an all-reduce of a copy of the whole input, then one slice),
  /// at the same memory, and sums that do not depend on where a slice lies. false uses c10d's.
  /// The same on every rank (checked at start-up). No effect on NCCL.
  bool reduce_scatter_all_to_all = true;
};

/// How gradient buckets travel between ranks (PyTorch DDP's communication hooks).
enum class GradientCompression {
  /// fp32 (the gradients' dtype) as they are.
  none,
  /// Each bucket cast to fp16 and pre-divided by the world size, summed, cast back: half the
  /// bytes (PyTorch's fp16_compress_hook). Gradients beyond fp16's range (65504 times the world
  /// size) become inf; with Fp16 precision the grad scaler then skips the step.
  fp16,
  /// The same in bf16: half the bytes, fp32's range, 8 bits of mantissa (bf16_compress_hook).
  bf16,
  /// PowerSGD (Vogels et al. 2019): each gradient matrix M (n x m; a weight of any dimension,
  /// seen as its first dimension by the rest) is sent as two rank-r factors P = M Q
  /// (n x r) and Q = M^T P (m x r), r(n + m) values instead of nm; vectors and matrices that
  /// would not shrink by PowerSgdOptions::min_compression_rate go as they are. See
  /// PowerSgdOptions.
  power_sgd,
};

/// The option's name: "none", "fp16", "bf16" or "power_sgd".
constexpr const char* to_string(GradientCompression compression) noexcept {
  switch (compression) {
    case GradientCompression::fp16: return "fp16";
    case GradientCompression::bf16: return "bf16";
    case GradientCompression::power_sgd: return "power_sgd";
    case GradientCompression::none: break;
  }
  return "none";
}

/// PowerSGD's settings (PyTorch's PowerSGDState arguments, its defaults).
/// Example:
///   Acc acc{{.ddp = {.compression = accelerate::GradientCompression::power_sgd,
///                    .power_sgd = {.rank = 4, .start_iteration = 10}}}};
struct PowerSgdOptions {
  /// Rank r of the approximation (matrix_approximation_rank): more is closer and costlier.
  int rank = 1;
  /// Synchronised steps sent uncompressed before compression starts (start_powerSGD_iter):
  /// early gradients change fast and PowerSGD follows them poorly. At least 2 with
  /// error_feedback or warm_start, as torch requires (the first step rebuilds the buckets).
  std::size_t start_iteration = 1000;
  /// Add what compression lost in the last step to this one's gradient before compressing
  /// (error feedback), at the price of one copy of the compressed gradients.
  bool error_feedback = true;
  /// Start each step's power iteration from the last step's Q instead of a new random one.
  bool warm_start = true;
  /// Compress a matrix only when nm >= min_compression_rate * r(n + m).
  double min_compression_rate = 2.0;
  /// Seed of the random initial Q, the same on every rank (no global generator is touched).
  std::uint64_t seed = 0;
};

/// Replicated data parallel's gradient reducer (PyTorch's DistributedDataParallel arguments,
/// Accelerate's DistributedDataParallelKwargs).
/// Example:
///   Acc acc{{.ddp = {.bucket_cap_bytes = 8 << 20, .find_unused_parameters = true}}};
struct DdpOptions {
  /// Gradient bucket size cap. 4 MiB was the fastest measured on 2-core CPU hosts
  /// (bench/README.md); DDP's 25 MB gives one bucket and no overlap on small models.
  std::size_t bucket_cap_bytes = std::size_t{4} << 20;
  /// Cap of the first bucket (the last layers' gradients), smaller so communication starts early.
  std::size_t first_bucket_cap_bytes = std::size_t{1} << 20;
  /// Broadcast rank 0's buffers (BatchNorm statistics) at prepare() and before every forward
  /// of a prepared model, as PyTorch DDP's option of that name: every rank must then run each
  /// forward. Off: buffers are broadcast once, at prepare(), and may drift apart.
  bool broadcast_buffers = true;
  /// Tolerate parameters that get no gradient in a backward pass (DDP's option of that name).
  bool find_unused_parameters = false;
  /// Each parameter's .grad is a view into its bucket (DDP's option of that name, here on by
  /// default): gradients are averaged in place, nothing is copied back, and the gradients
  /// take one copy of memory instead of two. Whatever replaces a .grad (optimizer.zero_grad()
  /// with set_to_none, LibTorch's default; a user's assignment) is copied into the bucket once
  /// and the .grad made a view again; zero_grad(false) keeps the views. Off: copies, as before.
  bool gradient_as_bucket_view = true;
  /// After the first synchronised backward, rebuild the buckets in the order rank 0's
  /// gradients became ready, so each bucket is launched as soon as backward can fill it (DDP
  /// does this always). Matters when modules are registered in another order than they run.
  bool bucket_order_from_arrival = true;
  /// On Gloo with 3 or more ranks, add up every gradient in rank order (rank 0's + rank
  /// 1's + ...) wherever it lies in its bucket: each bucket is reduce-scattered as an
  /// all-to-all (ProcessGroupOptions::reduce_scatter_all_to_all) and the summed slices are
  /// exchanged back in place, the same bytes as Gloo's ring all-reduce. The ring starts each
  /// chunk's sum at another rank, so a parameter moved to another position (arrival order,
  /// another bucket_cap_bytes) is summed in another order and may differ in the last bit;
  /// summed in rank order, results depend on no bucket layout, and each element is added as
  /// the sharded backends' reduce-scatter adds it. Costs more memory traffic (about 14 %
  /// longer steps with 3 ranks sharing 2 cores, bench/README.md) and up to world size - 1
  /// elements of padding per bucket. Off: Gloo's all-reduce, as PyTorch DDP. Two ranks
  /// (a + b either way), NCCL and compressed buckets always use the all-reduce. The same on
  /// every rank (checked at start-up).
  bool sum_in_rank_order = true;
  /// Compression of gradient buckets on the wire (replicated data parallel only).
  GradientCompression compression = GradientCompression::none;
  /// Settings of GradientCompression::power_sgd.
  PowerSgdOptions power_sgd{};
  /// Zero<_, 3> only (other backends ignore it): the submodules, by their names in
  /// named_modules() ("encoder", "layers.0"), whose parameters are gathered one at a time, for
  /// the call that runs each through accelerate::unit_forward(child, ...) in the model's
  /// forward and again for its backward. List them in the order forward runs them (each
  /// prefetches the next). The parameters outside them are gathered for the whole forward.
  /// Empty: the children of a torch::nn::Sequential, else the whole model as one unit.
  std::vector<std::string> shard_units = {};
  /// Zero<_, 3> only: start the all-gather of the unit that runs next while the current one
  /// computes, in forward and in backward (FSDP's forward and backward prefetch). Off: each
  /// unit is gathered when it runs, so one unit at most is whole at a time (with the
  /// parameters outside every unit), and no all-gather overlaps compute: the least memory.
  bool prefetch_units = true;
  /// Zero<_, 2|3> only: launched gradient buckets whose reduce-scatter may still run while
  /// backward goes on, each holding its full buffer; older ones are awaited and freed. Fewer
  /// trade overlap for memory; 0 awaits each bucket's reduce-scatter as soon as it starts.
  /// Example (the least memory stage 3 can train in, bench/README.md):
  ///   Acc acc{{.ddp = {.prefetch_units = false, .sharded_buckets_in_flight = 0}}};
  std::size_t sharded_buckets_in_flight = 2;
  /// join_uneven_inputs: what a step's gradient sum is divided by. False (the default): the
  /// ranks that trained in that step, so every step's gradient is a mean over real samples.
  /// True: the initial world size, as PyTorch DDP's join hook by default
  /// (divide_by_initial_world_size=True, so Accelerate's join_uneven_inputs): the ranks that
  /// ran out count as zeros, and the steps after the first rank ran out move less.
  bool join_divide_by_initial_world_size = false;
};

/// How prepared dataloaders shard (Accelerate's DataLoaderConfiguration).
/// Example:
///   Acc acc{{.data = {.even_batches = false}}};
///   Acc acc{{.data = {.split_batches = true}}};  // batch_size 64 on 4 ranks: 16 each
struct DataOptions {
  /// Pad the last batches by wrapping so every rank gets as many full batches.
  bool even_batches = true;
  /// A loader's batch size is the global batch: each of the N processes gets its 1/N slice of
  /// every batch (rank r the r-th), so the global batch, and the schedule, do not depend on N.
  /// The batch size of a DataLoader must then divide by N, and each batch of a range of
  /// batches must have rows divisible by N. Prepared schedulers step once per optimizer step
  /// instead of N times, as in Accelerate.
  bool split_batches = false;
  /// A prepared range of batches (any iterable) is read by rank 0 alone, which broadcasts each
  /// round's batches; the other ranks never iterate it. Each rank gets the batches it would
  /// have read itself. Without it every rank iterates the whole range and keeps its share, so
  /// W ranks do W times the reading (and any decoding inside the range's iterator). Map-style
  /// datasets are always read only at each rank's own indices, so this changes nothing there.
  /// Unlike Accelerate it is off by default: the broadcast costs two messages per batch.
  bool dispatch_batches = false;
};

/// Experiment trackers started by Accelerator::init_trackers.
/// Example:
///   Acc acc{{.tracking = {.log_with = {"tensorboard"}, .logging_dir = "runs/logs"}}};
struct TrackingOptions {
  /// Built-in trackers: "jsonl", "csv", "tensorboard" or "all".
  std::vector<std::string> log_with;
  /// Where they write; empty means project.project_dir (or "." without one).
  std::filesystem::path logging_dir;
};

/// Run-time options of an Accelerator, grouped by the part that reads them; the compile-time
/// choices are its policy types. Every default is written once, at its member.
/// Example:
///   Acc acc{{.seed = 42, .clip = {.max_norm = 1.0}, .project = {.project_dir = "runs/a"}}};
struct AcceleratorOptions {
  // --- device and seeding ---
  /// Run on the CPU even when a CUDA device is visible (SingleProcess only).
  bool cpu = false;
  /// When set, set_seed(seed) runs in the constructor: torch's CPU and CUDA generators.
  std::optional<std::uint64_t> seed;
  /// What happens to freed CPU buffers, for the whole process (glibc). True: kept in the heap
  /// instead of returned to the system and faulted in again every step (mmap threshold 32 MB,
  /// trim threshold 128 MB): faster steps. False: buffers of 4 MB and more go back to the
  /// system when freed (mmap threshold fixed at 4 MB): the resident memory follows the memory
  /// in use. Unset: the Backend policy's choice, true except under Zero<_, N>, whose point is
  /// memory (stage 3, 40M parameters, 2 ranks: peak 0.81 GB per rank against 0.89 GB kept,
  /// 1.17 GB kept without huge pages; CPU steps 1.25x as long as kept with huge_pages, 1.3x
  /// without; bench/README.md).
  std::optional<bool> retain_freed_memory;
  /// Back CPU tensor buffers of 2 MB and more with transparent huge pages (LibTorch's
  /// THP_MEM_ALLOC_ENABLE=1, set by the constructor unless the environment sets it already, so
  /// THP_MEM_ALLOC_ENABLE=0 still turns it off). A buffer faulted in costs 512 times fewer page
  /// faults: 40M parameters, 2 ranks, CPU, steps 1.07-1.3x faster for data parallel and every
  /// ZeRO stage, peak memory equal or lower (bench/README.md). Process-wide, and only in effect
  /// when the Accelerator is built before any CPU tensor (as in the quickstart); the
  /// environment report says whether it is. Needs the kernel's THP mode `madvise` or `always`.
  /// Example: `Acc acc{{.huge_pages = false}};`
  bool huge_pages = true;

  // --- the training step ---
  /// Step prepared schedulers only when the optimizer really stepped (num_processes times, as
  /// Accelerate does); false steps them on every call.
  bool step_scheduler_with_optimizer = true;
  /// backward() raises accelerate::Error when the loss is NaN or infinite, naming the call and
  /// the rank, before autograd runs (so no gradient, and no parameter, is touched). Costs one
  /// device-to-host read of the loss per backward when on, nothing when off. Set it alike on
  /// every rank: the rank that raises leaves its peers waiting in the gradient all-reduce
  /// until a launcher or the timeout stops them.
  bool check_finite_loss = false;

  // --- one group per part of the library ---
  AccumulationOptions accumulation{};
  ClipOptions clip{};
  PrecisionOptions precision{};
  ProcessGroupOptions process_group{};
  DdpOptions ddp{};
  DataOptions data{};
  /// Checkpoints: folder, automatic naming, rotation (Accelerate's ProjectConfiguration).
  ProjectConfiguration project{};
  TrackingOptions tracking{};
};

namespace detail {

/// Checks the options once; errors name the field and the bad value.
void validate(const AcceleratorOptions& o);

/// The configuration every rank must share, compared across ranks at start-up and recorded
/// in checkpoints: the policies (`slots`, describe_slots) and the options that change what
/// the ranks compute or which collectives they run.
std::string fingerprint(std::string_view slots, const AcceleratorOptions& o);

}  // namespace detail
}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/options.ipp>
#endif
