// Bodies of dataloader.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/prepared/dataloader.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE StateDict loader_state(const LoaderPosition& position, int world_size, std::size_t samples_consumed,
                                         const LoaderSharding& sharding) {
  StateDict s;
  s.values = {{"epoch", position.epoch}, {"batches_consumed", position.consumed}, {"world_size", world_size},
              {"samples_consumed", samples_consumed}, {"epoch_start", position.epoch_start}};
  if (const auto* spec = sharding.sampler) {
    s.values["seed"] = spec->seed;
    s.values["dataset_size"] = spec->dataset_size;
    s.values["batch_size"] = spec->batch_size;
    s.values["shuffle"] = spec->shuffle;
    s.values["drop_last"] = spec->drop_last;
    s.values["even_batches"] = spec->even_batches;
  }
  s.values["split_batches"] = sharding.split_batches;
  return s;
}

ACCELERATE_INLINE LoaderResume resume_loader(const StateDict& s, std::size_t here, const LoaderSharding& sharding) {
  const auto world = s.value<std::size_t>("world_size");
  const auto epoch = s.value<std::size_t>("epoch");
  const auto consumed = s.value<std::size_t>("batches_consumed");
  const bool saved_split = s.values.contains("split_batches") && s.value<bool>("split_batches");
  LoaderResume resumed;
  std::size_t skip = consumed, epoch_start = 0;
  if (const auto* sampler = sharding.sampler) {
    const auto& spec = *sampler;
    const auto dataset_size = s.value<std::size_t>("dataset_size");
    const auto batch_size = s.value<std::size_t>("batch_size");
    // Split batches are compared whole: the slices differ with the number of processes.
    const auto saved_batch = saved_split ? batch_size * world : batch_size;
    const auto this_batch = spec.split_batches ? spec.batch_size * here : spec.batch_size;
    ACCELERATE_CHECK(dataset_size == spec.dataset_size && saved_batch == this_batch,
                     "dataloader state: saved for a dataset of ", dataset_size, " samples in batches of ", saved_batch,
                     ", this loader has ", spec.dataset_size, " samples in batches of ", this_batch);
    // States written before these were recorded lack them.
    for (const auto& [key, mine] : {std::pair{"shuffle", spec.shuffle}, std::pair{"drop_last", spec.drop_last},
                                    std::pair{"even_batches", spec.even_batches},
                                    std::pair{"split_batches", spec.split_batches}}) {
      if (!s.values.contains(key)) continue;
      const bool saved = s.value<bool>(key);
      ACCELERATE_CHECK(saved == mine, "dataloader state: saved with ", key, " = ", saved ? "true" : "false",
                       ", this loader has ", key, " = ", mine ? "true" : "false", " (the batch order would differ)");
    }
    const auto saved_start = s.values.contains("epoch_start") ? s.value<std::size_t>("epoch_start") : 0;
    ACCELERATE_CHECK(saved_start <= dataset_size, "dataloader state: epoch_start ", saved_start,
                     " is past the dataset's ", dataset_size, " samples");
    if (world == here) {
      epoch_start = saved_start;
      data::ShardSampler trial(spec);
      trial.set_epoch_start(epoch_start);
      ACCELERATE_CHECK(consumed <= trial.batches_per_rank(), "dataloader state: ", consumed,
                       " batches consumed, but an epoch of this loader has ", trial.batches_per_rank());
    } else {
      epoch_start = s.values.contains("samples_consumed")
                        ? s.value<std::size_t>("samples_consumed")
                        : std::min(dataset_size, saved_start + consumed * world * batch_size);
      ACCELERATE_CHECK(epoch_start <= dataset_size, "dataloader state: ", epoch_start,
                       " samples consumed, but the dataset has ", dataset_size);
      skip = 0;
    }
    resumed.seed = s.value<std::uint64_t>("seed");
  } else {
    ACCELERATE_CHECK(saved_split == sharding.split_batches, "dataloader state: saved with split_batches = ",
                     saved_split ? "true" : "false", ", this loader has split_batches = ",
                     sharding.split_batches ? "true" : "false", " (the batches would differ)");
    if (world != here && !sharding.split_batches) {
      ACCELERATE_CHECK(consumed * world % here == 0, "dataloader state: saved by ", world, " processes after ",
                       consumed, " batches each (", consumed * world, " batches of the range); this run has ", here,
                       " processes, which cannot resume there: a range of batches is dealt in rounds of ", here,
                       " (prepare a map-style dataset to resume anywhere)");
      skip = consumed * world / here;
    }
  }
  resumed.position = {epoch, skip, epoch_start};
  return resumed;
}

ACCELERATE_INLINE LoaderCheck loader_check(const StateDict& state, std::optional<std::size_t> batches_per_rank,
                                           std::size_t index) {
  std::string shape;
  for (const auto& [key, value] : state.values.items()) shape += key + "=" + value.dump() + " ";
  if (batches_per_rank) shape += " batches_per_rank=" + std::to_string(*batches_per_rank);
  const std::string name = "dataloader_" + std::to_string(index);
  return {"prepare/" + name, std::move(shape),
          "prepare: " + name + " must have the same batch size, length and options on every rank"};
}

}  // namespace accelerate::detail
