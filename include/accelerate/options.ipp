// Bodies of options.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <sstream>

#include <accelerate/options.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE void validate(const AcceleratorOptions& o) {
  ACCELERATE_CHECK(std::isfinite(o.clip.max_norm) && o.clip.max_norm > 0,
                   "AcceleratorOptions::clip.max_norm must be a positive number, got ", o.clip.max_norm);
  ACCELERATE_CHECK(std::isfinite(o.clip.clip_value) && o.clip.clip_value > 0,
                   "AcceleratorOptions::clip.clip_value must be a positive number, got ", o.clip.clip_value);
  ACCELERATE_CHECK(o.process_group.timeout.count() > 0,
                   "AcceleratorOptions::process_group.timeout must be positive, got ",
                   o.process_group.timeout.count(), " ms");
  ACCELERATE_CHECK(o.ddp.bucket_cap_bytes > 0 && o.ddp.first_bucket_cap_bytes > 0,
                   "AcceleratorOptions::ddp.bucket_cap_bytes and ddp.first_bucket_cap_bytes must be > 0");
  ACCELERATE_CHECK(o.ddp.power_sgd.rank >= 1, "AcceleratorOptions::ddp.power_sgd.rank must be >= 1, got ",
                   o.ddp.power_sgd.rank);
  ACCELERATE_CHECK(std::isfinite(o.ddp.power_sgd.min_compression_rate) && o.ddp.power_sgd.min_compression_rate > 0,
                   "AcceleratorOptions::ddp.power_sgd.min_compression_rate must be a positive number, got ",
                   o.ddp.power_sgd.min_compression_rate);
  // As torch's PowerSGD hook: error feedback and warm start keep state across steps, and the
  // first synchronised step rebuilds the buckets in arrival order, which discards that state.
  ACCELERATE_CHECK(o.ddp.compression != GradientCompression::power_sgd ||
                       !(o.ddp.power_sgd.error_feedback || o.ddp.power_sgd.warm_start) ||
                       o.ddp.power_sgd.start_iteration > 1,
                   "AcceleratorOptions::ddp.power_sgd.start_iteration must be > 1 with error_feedback or "
                   "warm_start (the first synchronised step rebuilds the buckets, discarding their state), got ",
                   o.ddp.power_sgd.start_iteration);
  const auto& s = o.precision.grad_scaler;
  ACCELERATE_CHECK(s.init_scale > 0 && std::isfinite(s.init_scale),
                   "AcceleratorOptions::precision.grad_scaler.init_scale must be positive, got ", s.init_scale);
  ACCELERATE_CHECK(s.growth_factor > 1.0,
                   "AcceleratorOptions::precision.grad_scaler.growth_factor must be > 1, got ", s.growth_factor);
  ACCELERATE_CHECK(s.backoff_factor > 0.0 && s.backoff_factor < 1.0,
                   "AcceleratorOptions::precision.grad_scaler.backoff_factor must be in (0, 1), got ",
                   s.backoff_factor);
  ACCELERATE_CHECK(s.growth_interval > 0,
                   "AcceleratorOptions::precision.grad_scaler.growth_interval must be > 0, got ",
                   s.growth_interval);
  ACCELERATE_CHECK(!o.project.automatic_checkpoint_naming || !o.project.project_dir.empty(),
                   "AcceleratorOptions::project.automatic_checkpoint_naming needs project.project_dir");
  ACCELERATE_CHECK(!o.project.total_limit || *o.project.total_limit > 0,
                   "AcceleratorOptions::project.total_limit must be > 0 when set");
  for (const auto& name : o.tracking.log_with)
    ACCELERATE_CHECK(name == "jsonl" || name == "csv" || name == "tensorboard" || name == "all",
                     "AcceleratorOptions::tracking.log_with: unknown tracker '", name,
                     "'; valid: jsonl, csv, tensorboard, all (add your own with add_tracker)");
}

ACCELERATE_INLINE std::string fingerprint(std::string_view slots, const AcceleratorOptions& o) {
  std::ostringstream out;
  out << slots
      << " accumulation.num_steps=" << o.accumulation.num_steps
      << " accumulation.sync_with_dataloader=" << o.accumulation.sync_with_dataloader
      << " clip.max_norm=" << o.clip.max_norm << " clip.clip_value=" << o.clip.clip_value
      << " ddp.bucket_cap_bytes=" << o.ddp.bucket_cap_bytes
      << " ddp.first_bucket_cap_bytes=" << o.ddp.first_bucket_cap_bytes
      << " ddp.find_unused_parameters=" << o.ddp.find_unused_parameters
      << " data.even_batches=" << o.data.even_batches;
  if (o.data.split_batches) out << " data.split_batches=1";
  if (o.data.dispatch_batches) out << " data.dispatch_batches=1";
  // Options that change which collectives run, only when not the default, so a default
  // configuration's fingerprint (and its checkpoints') stays what it was.
  if (!o.ddp.bucket_order_from_arrival) out << " ddp.bucket_order_from_arrival=0";
  if (!o.ddp.sum_in_rank_order) out << " ddp.sum_in_rank_order=0";
  for (std::size_t i = 0; i < o.ddp.shard_units.size(); ++i)
    out << (i == 0 ? " ddp.shard_units=" : ",") << o.ddp.shard_units[i];
  if (o.accumulation.sync_each_batch) out << " accumulation.sync_each_batch=1";
  if (o.ddp.join_divide_by_initial_world_size) out << " ddp.join_divide_by_initial_world_size=1";
  if (o.accumulation.loss_divisor == LossDivisor::num_steps) out << " accumulation.loss_divisor=num_steps";
  if (o.ddp.compression != GradientCompression::none) {
    out << " ddp.compression=" << to_string(o.ddp.compression);
    if (o.ddp.compression == GradientCompression::power_sgd)
      out << " ddp.power_sgd.rank=" << o.ddp.power_sgd.rank << " ddp.power_sgd.start_iteration="
          << o.ddp.power_sgd.start_iteration << " ddp.power_sgd.min_compression_rate="
          << o.ddp.power_sgd.min_compression_rate;
  }
  return out.str();
}

}  // namespace accelerate::detail
