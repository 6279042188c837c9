// save_state / load_state: the whole training state in Accelerate's file layout, with tensors in
// safetensors and everything else in JSON (no pickle), written into a staging folder and
// published atomically; load_state() with no folder finds the latest complete checkpoint.
//
// Layout of a checkpoint folder (Accelerate's names, our formats):
//   model.safetensors, model_1.safetensors ...        prepared models (Hugging Face format)
//   optimizer.{safetensors,json}, optimizer_1...      optimizer state and param groups
//   scheduler.json, scheduler_1.json ...              scheduler step counts
//   dl_state_dict.json, dl_state_dict_1.json ...      dataloader positions
//   scaler.json                                       grad scaler (Fp16)
//   random_states_<rank>.{safetensors,json}           each rank's RNGs and micro-step counter
//   custom_checkpoint_<i>.{safetensors,json}          register_for_checkpointing objects
//   accelerate_state.json                             manifest, written last
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <accelerate/checkpoint/atomic_dir.hpp>
#include <accelerate/checkpoint/files.hpp>
#include <accelerate/checkpoint/project.hpp>
#include <accelerate/checkpoint/registry.hpp>
#include <accelerate/checkpoint/safetensors.hpp>
#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/random.hpp>
#include <accelerate/version.hpp>

namespace accelerate::checkpoint {

/// Format tag of the manifest; bumped when the layout changes incompatibly.
inline constexpr const char* state_format = "accelerate-cpp/state/1";

/// Accelerate's file stem for the index-th object of a kind ("model", "model_1",
/// "dl_state_dict", "custom_checkpoint_0", "scaler" ...). The micro-step counter has none: it
/// travels in each rank's random_states_<rank>.
inline std::string state_stem(Entry::Kind kind, std::size_t index) {
  using Kind = Entry::Kind;
  const auto numbered = [&](const char* base) {
    return index == 0 ? std::string(base) : std::string(base) + "_" + std::to_string(index);
  };
  switch (kind) {
    case Kind::model: return numbered("model");
    case Kind::optimizer: return numbered("optimizer");
    case Kind::scheduler: return numbered("scheduler");
    case Kind::dataloader: return numbered("dl_state_dict");
    case Kind::custom: return "custom_checkpoint_" + std::to_string(index);
    case Kind::scaler: return numbered("scaler");
    case Kind::micro_step: return "random_states";
  }
  return "unknown";
}

/// Whether an entry travels in its rank's random_states_<rank> file, beside the RNGs: a step
/// state each rank owns (the micro-step counter). Every other entry has a file of its own.
inline bool in_rank_file(const Entry& entry) {
  return is_step_state(entry.kind) && entry.owner == EntryOwner::every_rank;
}

/// The file stem of an entry: its kind's stem, with "_rank<r>" for state each rank owns.
inline std::string entry_stem(const Entry& entry, std::size_t index, int rank) {
  const std::string stem = state_stem(entry.kind, index);
  return entry.owner == EntryOwner::every_rank ? stem + "_rank" + std::to_string(rank) : stem;
}

inline const char* kind_name(Entry::Kind kind) {
  using Kind = Entry::Kind;
  switch (kind) {
    case Kind::model: return "model";
    case Kind::optimizer: return "optimizer";
    case Kind::scheduler: return "scheduler";
    case Kind::dataloader: return "dataloader";
    case Kind::custom: return "custom";
    case Kind::scaler: return "scaler";
    case Kind::micro_step: return "micro_step";
  }
  return "unknown";
}

/// Writes `json` to `path` and fsyncs it.
inline void write_json_file(const std::filesystem::path& path, const nlohmann::json& json) {
  {
    std::ofstream out(path);
    out << json.dump(2) << '\n';
    out.flush();
    ACCELERATE_CHECK(out.good(), "checkpoint: writing ", path.string(), " failed (disk full?)");
  }
  fsync_path(path);
}

/// Reads a JSON file; a missing or malformed file is an error naming it.
inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  const std::string text = read_regular_file(path, "checkpoint");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    detail::fail("checkpoint: ", path.string(), " is not valid JSON (", e.what(), ")");
  }
}

/// Writes a StateDict as `<stem>.safetensors` (its tensors, when any) and `<stem>.json` (its
/// values, when any, or when there are no tensors).
inline void write_state_files(const std::filesystem::path& dir, const std::string& stem,
                              const StateDict& state,
                              const std::map<std::string, std::string>& metadata = {}) {
  if (!state.tensors.empty()) save_safetensors(dir / (stem + ".safetensors"), state.tensors, metadata);
  if (!state.values.empty() || state.tensors.empty()) write_json_file(dir / (stem + ".json"), state.values);
}

/// Reads what write_state_files() wrote.
inline StateDict read_state_files(const std::filesystem::path& dir, const std::string& stem) {
  StateDict state;
  const auto tensors = dir / (stem + ".safetensors");
  const auto values = dir / (stem + ".json");
  const bool has_tensors = path_exists(tensors, "load_state"), has_values = path_exists(values, "load_state");
  ACCELERATE_CHECK(has_tensors || has_values, "load_state: ",
                   dir.string(), " has neither ", stem, ".safetensors nor ", stem, ".json");
  if (has_tensors) state.tensors = SafetensorsFile::open(tensors).tensors();
  if (has_values) state.values = read_json_file(values);
  return state;
}

/// This process's generators (CPU, then each CUDA device) as tensors.
inline StateDict rng_state() {
  StateDict state;
  auto generators = detail::all_generators();
  for (std::size_t i = 0; i < generators.size(); ++i) {
    std::lock_guard<std::mutex> lock(generators[i].mutex());
    state.tensors[i == 0 ? "cpu" : "cuda_" + std::to_string(i - 1)] = generators[i].get_state();
  }
  return state;
}

/// Checks that rng_state() could be restored from `state` (every generator present, each state
/// accepted by a copy of its generator) without touching the generators.
inline void check_rng_state(const StateDict& state, const std::string& file) {
  auto generators = detail::all_generators();
  for (std::size_t i = 0; i < generators.size(); ++i) {
    const std::string key = i == 0 ? "cpu" : "cuda_" + std::to_string(i - 1);
    const auto it = state.tensors.find(key);
    ACCELERATE_CHECK(it != state.tensors.end(), "load_state: ", file, " has no state for generator '",
                     key, "' (saved with fewer CUDA devices?)");
    try {
      at::Generator trial = [&] {
        std::lock_guard<std::mutex> lock(generators[i].mutex());
        return generators[i].clone();
      }();
      trial.set_state(it->second.clone());
    } catch (const c10::Error& e) {
      detail::fail("load_state: ", file, ": the state of generator '", key, "' is not one this generator accepts (",
                   e.what_without_backtrace(), ")");
    }
  }
}

/// The RNG state of rank `rank` when a checkpoint holds none for it (resumed on more processes
/// than saved it): each generator is seeded with a 64-bit mix of rank `rank` and an FNV-1a
/// hash of the saved rank 0's state of that generator, so it is the same on every resume and
/// differs between ranks and from rank 0's stream.
inline StateDict derived_rng_state(const StateDict& rank0, int rank, const std::string& file) {
  check_rng_state(rank0, file);
  StateDict out;
  auto generators = detail::all_generators();
  for (std::size_t i = 0; i < generators.size(); ++i) {
    const std::string key = i == 0 ? "cpu" : "cuda_" + std::to_string(i - 1);
    const at::Tensor bytes = rank0.tensors.at(key).contiguous().to(at::kCPU);
    const auto* data = static_cast<const unsigned char*>(bytes.data_ptr());
    std::uint64_t hash = 14695981039346656037ull;  // FNV-1a
    for (std::size_t b = 0; b < bytes.nbytes(); ++b) hash = (hash ^ data[b]) * 1099511628211ull;
    std::uint64_t seed = hash + 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(rank + 1);  // splitmix64
    seed = (seed ^ (seed >> 30)) * 0xBF58476D1CE4E5B9ull;
    seed = (seed ^ (seed >> 27)) * 0x94D049BB133111EBull;
    seed ^= seed >> 31;
    at::Generator trial = [&] {
      std::lock_guard<std::mutex> lock(generators[i].mutex());
      return generators[i].clone();
    }();
    trial.set_current_seed(seed);
    out.tensors[key] = trial.get_state();
  }
  return out;
}

/// Restores rng_state(); generators the checkpoint lacks (a GPU count that changed) are an
/// error rather than silently left as they are.
inline void load_rng_state(const StateDict& state, const std::string& file) {
  check_rng_state(state, file);
  auto generators = detail::all_generators();
  for (std::size_t i = 0; i < generators.size(); ++i) {
    const std::string key = i == 0 ? "cpu" : "cuda_" + std::to_string(i - 1);
    std::lock_guard<std::mutex> lock(generators[i].mutex());
    generators[i].set_state(state.tensors.at(key).clone());
  }
}

}  // namespace accelerate::checkpoint

namespace accelerate {

/// How load_state resumes.
/// Example:
///   acc.load_state("runs/a/state", {.allow_configuration_change = true});  // e.g. now in bf16
struct LoadStateOptions {
  /// Resume a checkpoint saved by another configuration (policies, accumulation steps, clip
  /// options: the fingerprint in the manifest); otherwise that is an error naming both.
  bool allow_configuration_change = false;
  /// Resume a checkpoint saved by another number of processes; otherwise that is an error
  /// naming both. Replicated state loads as it is; each rank's own state is re-cut (a sharded
  /// optimizer's slices); ranks the checkpoint has no RNG state for derive one
  /// (derived_rng_state); dataloaders skip the samples all ranks consumed and deal the rest of
  /// the epoch over the new ranks. The micro-step counter is rank 0's.
  bool allow_world_size_change = false;
  /// Compare every file's checksum with the manifest's (a file swapped in from another
  /// checkpoint of the same shapes, or damaged). Costs about one pass over the checkpoint
  /// from memory; bench/README.md measures it.
  bool verify_checksums = true;
};

}  // namespace accelerate

namespace accelerate::checkpoint {

/// What the accelerator hands to save_state/load_state.
struct StateSources {
  const Registry* registry;  // what to save and restore
  int rank;
  int world_size;
  /// Whether this rank writes the state every rank holds alike (the engine's
  /// writes_replicated_state: the main process for data parallel).
  bool writes_replicated_state;
  std::string configuration;  // compile-time fingerprint
  std::function<void()> barrier;
};

/// The folder save_state() writes: `dir` when given, else the next automatic checkpoint. The
/// number skips past checkpoints already in the folder (a new run in an old project), so an
/// automatic save never collides with or overwrites one (Accelerate raises instead).
inline std::filesystem::path state_target(ProjectConfiguration& project,
                                          const std::optional<std::filesystem::path>& dir) {
  if (dir) return *dir;
  ACCELERATE_CHECK(project.automatic_checkpoint_naming, "save_state: no folder given, and "
                   "ProjectConfiguration::automatic_checkpoint_naming is off (give a folder or turn it on)");
  const auto base = project.project_dir / "checkpoints";
  for (const auto& [number, path] : list_checkpoints(base))
    project.iteration = std::max(project.iteration, number + 1);
  while (std::filesystem::exists(base / ("checkpoint_" + std::to_string(project.iteration)))) ++project.iteration;
  return base / ("checkpoint_" + std::to_string(project.iteration));
}

/// Writes every object's state into a staging folder, then (main process) the manifest, and
/// publishes the folder atomically; rotates old automatic checkpoints after that, so a crash
/// never costs a complete checkpoint. Collective: every rank calls it.
inline std::filesystem::path save_state(const StateSources& src, ProjectConfiguration& project,
                                        const std::optional<std::filesystem::path>& dir) {
  namespace fs = std::filesystem;
  const fs::path target = state_target(project, dir);
  const bool main = src.rank == 0;
  if (main) {
    const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
    fs::create_directories(parent);
    if (!dir) {  // leftovers of saves or rotations a crash interrupted
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator(parent, ec)) {
        const auto name = entry.path().filename().string();
        if (name.starts_with(".checkpoint_") && (name.ends_with(".incomplete") || name.ends_with(".deleting")))
          fs::remove_all(entry.path(), ec);
      }
    }
    begin_staging(target);
  }
  src.barrier();
  const fs::path staging = staging_path(target);

  // Objects and the scaler get a file each, written by the ranks that own them; this rank's
  // own step states (the micro-step counter) join its RNGs in random_states_<rank>.
  std::map<Entry::Kind, std::size_t> counts;
  StateDict per_rank = rng_state();
  for (const auto* list : {&src.registry->objects(), &src.registry->step_states()}) {
    for (const auto& entry : *list) {
      const std::size_t index = counts[entry.kind]++;
      if (in_rank_file(entry)) {
        per_rank.values.update(entry.save().values);
        continue;
      }
      if (entry.owner == EntryOwner::main_rank && !src.writes_replicated_state) continue;
      const bool model = entry.kind == Entry::Kind::model;
      write_state_files(staging, entry_stem(entry, index, src.rank), entry.save(),
                        model ? std::map<std::string, std::string>{{"format", "pt"}}
                              : std::map<std::string, std::string>{});
    }
  }
  write_state_files(staging, "random_states_" + std::to_string(src.rank), per_rank);
  src.barrier();

  if (main) {
    // Sizes and checksums: a truncated file, or one swapped in from another checkpoint of the
    // same shapes, is refused by load_state.
    nlohmann::json files = nlohmann::json::object();
    for (const auto& file : fs::directory_iterator(staging))
      files[file.path().filename().string()] = {{"bytes", fs::file_size(file.path())},
                                                {"checksum", file_checksum(file.path(), "save_state")}};
    nlohmann::json objects = nlohmann::json::object();
    for (const auto& [kind, n] : counts)
      if (!is_step_state(kind)) objects[kind_name(kind)] = n;
    write_json_file(staging / std::string(manifest_name),
                    {{"format", state_format},
                     {"library", std::string("accelerate-cpp ") + version_string},
                     {"world_size", src.world_size},
                     {"configuration", src.configuration},
                     {"objects", objects},
                     {"files", files}});
    commit_staging(target);
    if (!dir && project.total_limit) {
      // Renamed out of sight first: a crash while deleting must not leave a partial folder
      // that still looks like a checkpoint.
      auto complete = list_checkpoints(project.project_dir / "checkpoints");
      for (std::size_t i = 0; i + *project.total_limit < complete.size(); ++i) {
        const auto& old = complete[i].second;
        const auto doomed = old.parent_path() / ("." + old.filename().string() + ".deleting");
        std::error_code ec;
        fs::remove_all(doomed, ec);
        fs::rename(old, doomed);
        fs::remove_all(doomed, ec);
      }
    }
  }
  src.barrier();
  ++project.iteration;
  return target;
}

/// The latest complete automatic checkpoint, or an error naming where it looked.
inline std::filesystem::path latest_checkpoint(const ProjectConfiguration& project) {
  ACCELERATE_CHECK(project.automatic_checkpoint_naming, "load_state: no folder given, and "
                   "ProjectConfiguration::automatic_checkpoint_naming is off");
  const auto base = project.project_dir / "checkpoints";
  const auto complete = list_checkpoints(base);
  ACCELERATE_CHECK(!complete.empty(), "load_state: no complete checkpoint under ", base.string());
  return complete.back().second;
}

/// Files and state of one entry read for load_state.
struct PendingLoad {
  const Entry* entry;
  std::string files;  // named in errors
  StateDict state;
};

/// This rank's state of an entry each rank owns, made by the entry's reshard() from every
/// rank's file of a checkpoint saved by `saved_world` processes.
template <class WithFiles>
PendingLoad resharded(const Entry& entry, std::size_t index, const std::filesystem::path& source,
                      int saved_world, WithFiles& with_files) {
  const std::string pattern = (source / entry_stem(entry, index, 0)).string();
  const std::string files = pattern.substr(0, pattern.size() - 1) + "{0.." + std::to_string(saved_world - 1) +
                            "}.{safetensors,json}";
  ACCELERATE_CHECK(entry.reshard != nullptr, "load_state: ", files, " hold per-rank ", kind_name(entry.kind),
                   " state of ", saved_world, " process(es), which has no rule to re-cut it for another number");
  PendingLoad p{&entry, files, {}};
  with_files(files, [&] {
    std::vector<StateDict> saved;
    for (int r = 0; r < saved_world; ++r) saved.push_back(read_state_files(source, entry_stem(entry, index, r)));
    p.state = entry.reshard(saved);
    if (entry.check) entry.check(p.state);
  });
  return p;
}

/// Restores what save_state() wrote, all or nothing. Everything is read and checked before any
/// object changes: the folder is complete, every file has the size and checksum the manifest
/// recorded, the run matches (world size, number of objects of each kind, the configuration
/// fingerprint unless `options` allows a change), every model's keys, shapes and dtypes and
/// every RNG state fit. Objects are then restored in order with a snapshot each; if one fails,
/// those already restored get their snapshots back, so on any error every object is as it was.
/// Errors name the file and the problem.
inline std::filesystem::path load_state(const StateSources& src, ProjectConfiguration& project,
                                        const std::optional<std::filesystem::path>& dir,
                                        const LoadStateOptions& options = {}) {
  namespace fs = std::filesystem;
  using Kind = Entry::Kind;
  const fs::path source = dir ? *dir : latest_checkpoint(project);
  ACCELERATE_CHECK(path_kind(source, "load_state") == PathKind::directory, "load_state: ", source.string(),
                   " is not a folder");
  const fs::path manifest_path = source / std::string(manifest_name);
  ACCELERATE_CHECK(path_exists(manifest_path, "load_state"), "load_state: ", source.string(), " is not a complete checkpoint (",
                   manifest_name, " is missing; an interrupted save?)");
  const auto manifest = read_json_file(manifest_path);
  int saved_world = src.world_size;
  try {
    ACCELERATE_CHECK(manifest.value("format", "") == state_format, "load_state: ", manifest_path.string(),
                     ": format '", manifest.value("format", ""), "', expected '", state_format, "'");
    saved_world = manifest.at("world_size").get<int>();
    ACCELERATE_CHECK(saved_world >= 1, "load_state: ", manifest_path.string(), ": world_size ", saved_world);
    ACCELERATE_CHECK(saved_world == src.world_size || options.allow_world_size_change, "load_state: ",
                     source.string(), " was saved by ", saved_world, " process(es); this run has ", src.world_size,
                     " (LoadStateOptions::allow_world_size_change = true resumes it here: per-rank state is "
                     "re-cut and the rest of the epoch dealt over this run's processes)");
    const auto saved_configuration = manifest.value("configuration", std::string());
    ACCELERATE_CHECK(options.allow_configuration_change || saved_configuration == src.configuration,
                     "load_state: ", source.string(), " was saved by another configuration:\n  saved: ",
                     saved_configuration, "\n  this run: ", src.configuration,
                     "\n(LoadStateOptions::allow_configuration_change = true resumes anyway)");
    for (const auto& [name, recorded] : manifest.at("files").items()) {
      const fs::path file = source / name;
      ACCELERATE_CHECK(path_kind(file, "load_state") == PathKind::regular, "load_state: ", file.string(),
                       " is listed in the manifest but missing or not a regular file");
      // Older manifests record the size alone.
      const auto bytes = recorded.is_object() ? recorded.at("bytes").get<std::uintmax_t>() : recorded.get<std::uintmax_t>();
      ACCELERATE_CHECK(fs::file_size(file) == bytes, "load_state: ", file.string(), " has ", fs::file_size(file),
                       " bytes, the manifest recorded ", bytes, " (truncated or replaced?)");
      if (options.verify_checksums && recorded.is_object() && recorded.contains("checksum")) {
        const auto expected = recorded.at("checksum").get<std::string>();
        const auto found = file_checksum(file, "load_state");
        ACCELERATE_CHECK(found == expected, "load_state: ", file.string(), " has checksum ", found,
                         ", the manifest recorded ", expected, " (a file from another checkpoint, or damaged)");
      }
    }
    std::map<Kind, std::size_t> here;
    for (const auto& entry : src.registry->objects()) ++here[entry.kind];
    const auto& saved = manifest.at("objects");
    for (const Kind kind : {Kind::model, Kind::optimizer, Kind::scheduler, Kind::dataloader, Kind::custom}) {
      const auto n = saved.value(kind_name(kind), std::size_t{0});
      ACCELERATE_CHECK(n == here[kind], "load_state: ", source.string(), " holds ", n, " ", kind_name(kind),
                       " state(s); this accelerator has ", here[kind],
                       " (prepare and register the same objects as the run that saved it)");
    }
  } catch (const nlohmann::json::exception& e) {
    detail::fail("load_state: ", manifest_path.string(), " is malformed (", e.what(), ")");
  }

  // Errors of one object name the file(s) it was read from.
  auto with_files = [](const std::string& files, auto&& action) {
    try {
      action();
    } catch (const Error& e) {
      detail::fail("load_state: ", files, ": ", e.what());
    } catch (const nlohmann::json::exception& e) {
      detail::fail("load_state: ", files, ": unexpected content (", e.what(), ")");
    } catch (const c10::Error& e) {
      detail::fail("load_state: ", files, ": ", e.what_without_backtrace());
    }
  };

  // 1. Read everything and check what can be checked without changing anything.
  // A rank the checkpoint has no file for (more processes than saved it) takes rank 0's
  // micro-step counter and derives its RNGs from rank 0's.
  const bool resharding = saved_world != src.world_size;
  const int rng_rank = src.rank < saved_world ? src.rank : 0;
  const std::string rng_stem = "random_states_" + std::to_string(rng_rank);
  const std::string rng_files = (source / rng_stem).string() + ".{safetensors,json}";
  StateDict per_rank;
  with_files(rng_files, [&] {
    per_rank = read_state_files(source, rng_stem);
    const std::string file = (source / rng_stem).string() + ".safetensors";
    if (rng_rank == src.rank) check_rng_state(per_rank, file);
    else per_rank.tensors = derived_rng_state(per_rank, src.rank, file).tensors;
  });
  using Pending = PendingLoad;
  std::vector<Pending> pending;  // objects, then step states: the order restores follow
  std::map<Kind, std::size_t> counts;
  for (const auto* list : {&src.registry->objects(), &src.registry->step_states()}) {
    for (const auto& entry : *list) {
      const std::size_t index = counts[entry.kind]++;
      if (in_rank_file(entry)) {  // read above
        pending.push_back({&entry, rng_files, per_rank});
        continue;
      }
      if (resharding && entry.owner == EntryOwner::every_rank) {
        pending.push_back(resharded(entry, index, source, saved_world, with_files));
        continue;
      }
      const std::string stem = entry_stem(entry, index, src.rank);
      const bool tensors = path_exists(source / (stem + ".safetensors"), "load_state");
      const bool values = path_exists(source / (stem + ".json"), "load_state");
      Pending p{&entry, (source / stem).string() +
                            (tensors && values ? ".{safetensors,json}" : tensors ? ".safetensors" : ".json"), {}};
      with_files(p.files, [&] {
        p.state = read_state_files(source, stem);
        if (entry.check) entry.check(p.state);
      });
      pending.push_back(std::move(p));
    }
  }

  // 2. Restore, undoing on failure. Entries with a check cannot fail and come last.
  auto deep_copy = [](StateDict s) {
    for (auto& [key, t] : s.tensors) t = t.defined() ? t.clone() : t;
    return s;
  };
  std::vector<std::function<void()>> undo;  // restores, in the order the objects were changed
  try {
    for (auto& p : pending) {
      if (p.entry->check) continue;
      undo.push_back([entry = p.entry, snapshot = deep_copy(p.entry->save())] { entry->load(snapshot); });
      with_files(p.files, [&] { p.entry->load(p.state); });
    }
  } catch (const std::exception& e) {
    // Every restore is tried; one that fails too is named with the original error.
    std::string also;
    for (auto it = undo.rbegin(); it != undo.rend(); ++it) {
      try {
        (*it)();
      } catch (const std::exception& restore) {
        also += std::string("\n  and restoring an object's previous state failed too: ") + restore.what();
      }
    }
    if (!also.empty()) detail::fail(e.what(), also);
    throw;
  }
  for (auto& p : pending)
    if (p.entry->check) p.entry->load(p.state);
  load_rng_state(per_rank, (source / rng_stem).string() + ".safetensors");

  // Continue numbering after the loaded checkpoint (Accelerate leaves `iteration` behind and
  // the next save collides).
  if (project.automatic_checkpoint_naming) {
    if (const auto n = checkpoint_number(source.filename().string()))
      project.iteration = std::max(project.iteration, *n + 1);
  }
  return source;
}

}  // namespace accelerate::checkpoint
