// save_state / load_state: the whole training state in Accelerate's file layout, with tensors in
// safetensors and everything else in JSON (no pickle), written into a staging folder and
// published atomically; load_state() with no folder finds the latest complete checkpoint.
//
// Layout of a checkpoint folder (Accelerate's names, our formats):
//   model.safetensors, model_1.safetensors ...        prepared models (Hugging Face format)
//   optimizer.{safetensors,json}, optimizer_1...      optimizer state and param groups
//   scheduler.json, scheduler_1.json ...              scheduler step counts
//   dl_state_dict.json, dl_state_dict_1.json ...      dataloader positions
//   scaler.json                                       grad scaler (Fp16's own stem)
//   random_states_<rank>.{safetensors,json}           each rank's RNGs and micro-step counter
//   custom_checkpoint_<i>.{safetensors,json}          register_for_checkpointing objects
//   accelerate_state.json                             manifest, written last
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <accelerate/checkpoint/atomic_dir.hpp>
#include <accelerate/checkpoint/files.hpp>
#include <accelerate/checkpoint/project.hpp>
#include <accelerate/checkpoint/registry.hpp>
#include <accelerate/checkpoint/safetensors.hpp>
#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/detail/malloc_tuning.hpp>
#include <accelerate/random.hpp>
#include <accelerate/version.hpp>

namespace accelerate::checkpoint {

/// Format tag of the manifest; bumped when the layout changes incompatibly.
inline constexpr const char* state_format = "accelerate-cpp/state/1";

/// Accelerate's file stem for the index-th object of a kind ("model", "model_1",
/// "dl_state_dict", "custom_checkpoint_0" ...). The micro-step counter and the models'
/// gradient-sync layouts have none: they travel in each rank's random_states_<rank>. A
/// Precision policy's state is named by the policy (Entry::stem; Fp16's "scaler").
std::string state_stem(Entry::Kind kind, std::size_t index);

/// Whether an entry travels in its rank's random_states_<rank> file, beside the RNGs: a step
/// state each rank owns (the micro-step counter). Every other entry has a file of its own.
inline bool in_rank_file(const Entry& entry) {
  return is_step_state(entry.kind) && entry.owner == EntryOwner::every_rank;
}

/// The file stem of an entry: its own (Entry::stem) or its kind's, numbered as its kind's
/// from the second on, with "_rank<r>" for state each rank owns.
inline std::string entry_stem(const Entry& entry, std::size_t index, int rank) {
  const std::string stem = entry.stem.empty()  ? state_stem(entry.kind, index)
                           : index == 0        ? entry.stem
                                               : entry.stem + "_" + std::to_string(index);
  return entry.owner == EntryOwner::every_rank ? stem + "_rank" + std::to_string(rank) : stem;
}

const char* kind_name(Entry::Kind kind);

/// Writes `json` to `path` and fsyncs it.
void write_json_file(const std::filesystem::path& path, const nlohmann::json& json);

/// Reads a JSON file; a missing or malformed file is an error naming it.
nlohmann::json read_json_file(const std::filesystem::path& path);

/// Writes a StateDict as `<stem>.safetensors` (its tensors, when any) and `<stem>.json` (its
/// values, when any, or when there are no tensors).
inline void write_state_files(const std::filesystem::path& dir, const std::string& stem,
                              const StateDict& state,
                              const std::map<std::string, std::string>& metadata = {}) {
  if (!state.tensors.empty()) save_safetensors(dir / (stem + ".safetensors"), state.tensors, metadata);
  if (!state.values.empty() || state.tensors.empty()) write_json_file(dir / (stem + ".json"), state.values);
}

/// Reads what write_state_files() wrote.
StateDict read_state_files(const std::filesystem::path& dir, const std::string& stem);

/// This process's generators (CPU, then each CUDA device) as tensors.
StateDict rng_state();

/// Checks that rng_state() could be restored from `state` (every generator present, each state
/// accepted by a copy of its generator) without touching the generators.
void check_rng_state(const StateDict& state, const std::string& file);

/// The RNG state of rank `rank` when a checkpoint holds none for it (resumed on more processes
/// than saved it): each generator is seeded with a 64-bit mix of rank `rank` and an FNV-1a
/// hash of the saved rank 0's state of that generator, so it is the same on every resume and
/// differs between ranks and from rank 0's stream.
StateDict derived_rng_state(const StateDict& rank0, int rank, const std::string& file);

/// Restores rng_state(); generators the checkpoint lacks (a GPU count that changed) are an
/// error rather than silently left as they are.
void load_rng_state(const StateDict& state, const std::string& file);

}  // namespace accelerate::checkpoint

namespace accelerate {

/// How save_state writes.
/// Example:
///   acc.save_state(std::nullopt, {.asynchronous = true});   // returns once the state is copied
struct SaveStateOptions {
  /// Copy the state to host memory (pinned for CUDA tensors), return, and write the folder in a
  /// background thread while training goes on. The next save_state, load_state,
  /// wait_for_save() or the accelerator's destructor waits for it, and the next of those
  /// calls raises an error the writer met, naming the file. The folder appears only once
  /// complete, as with a synchronous save, and rotation only follows a published checkpoint.
  bool asynchronous = false;
};

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
  /// the epoch over the new ranks. The micro-step counter is rank 0's. Accelerator::load_state
  /// also allows it when ACCELERATE_ALLOW_WORLD_SIZE_CHANGE=1 (set by an elastic launch).
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
  /// How long an asynchronous save's main process waits for the other ranks' files.
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  /// Called on every rank with the staged folder before this rank's files are written
  /// (StateHooks::run_save), and with the folder to load once verified (run_load).
  std::function<void(const std::filesystem::path&)> before_save = {};
  std::function<void(const std::filesystem::path&)> before_load = {};
  /// Collective: the lowest rank that passes true, or -1 when none does (one small
  /// all-reduce). Unset: this process alone.
  std::function<int(bool failed)> first_failed_rank = {};
};

/// Runs this rank's part of a collective step of save_state, then agrees with every rank on
/// whether it failed anywhere (collective, even when `step` throws): an error on one rank (an
/// object whose state_dict() throws, a file that cannot be written) is raised on every rank,
/// this rank's own or one naming the first rank that failed, and `on_failure` runs first on
/// every rank. So no rank is left waiting in a collective the failing rank never reaches.
void agreed_step(const StateSources& src, const std::string& doing, const std::function<void()>& step,
                 const std::function<void()>& on_failure = {});

/// The folder save_state() writes: `dir` when given, else the next automatic checkpoint. The
/// number skips past checkpoints already in the folder (a new run in an old project), so an
/// automatic save never collides with or overwrites one (Accelerate raises instead).
std::filesystem::path state_target(ProjectConfiguration& project,
                                   const std::optional<std::filesystem::path>& dir);

/// One rank's part of a checkpoint, taken when save_state is called: the files it writes and,
/// for the main rank, what the manifest records and whether to rotate afterwards.
struct SavePlan {
  struct File {
    std::string stem;
    StateDict state;
    std::map<std::string, std::string> metadata;
  };
  std::filesystem::path target;
  int rank = 0;
  int world_size = 1;
  std::vector<File> files;
  nlohmann::json manifest;  // everything but "files" (main rank)
  std::string save_id;      // the same on every rank: tells this save's manifest from an older one
  std::optional<std::filesystem::path> rotate_under;  // automatic checkpoints: rotate there
  std::optional<std::size_t> total_limit;
  std::vector<at::Tensor> host_copies;  // the tensors copied to host memory, in the order taken
};

/// Marker files of an asynchronous save inside the staging folder (hidden; never published).
inline std::filesystem::path save_marker(const std::filesystem::path& staging, const std::string& what, int rank) {
  return staging / (".rank" + std::to_string(rank) + "." + what);
}
inline constexpr const char* save_id_marker = ".save_id";

/// A copy of `t` in host memory (pinned for a CUDA tensor, so the copy is a fast DMA), which
/// training can no longer change; into `spare` when it has t's shape and dtype (a buffer of
/// the previous asynchronous save, whose pages are already mapped, and pinned).
at::Tensor host_copy(const at::Tensor& t, const at::Tensor& spare = {});

/// Starts a save (collective): picks the folder, makes its staging folder (main process) with
/// the save's id, and takes every object's state. With `copy`, tensors are copied to host
/// memory (an asynchronous save writes them while training changes the originals), reusing
/// `spares` (the previous plan's host_copies, in the same order) where they fit.
SavePlan plan_save(const StateSources& src, ProjectConfiguration& project,
                   const std::optional<std::filesystem::path>& dir, bool copy,
                   const std::vector<at::Tensor>& spares = {});

/// plan_save's second half: every object's state into `plan` (its files and, on the main
/// rank, the manifest), copied to host memory with `copy`.
void take_state(const StateSources& src, SavePlan& plan, bool copy, const std::vector<at::Tensor>& spares);

/// Writes this rank's files of `plan` into the staging folder, each fsynced.
inline void write_planned_files(const SavePlan& plan) {
  const auto staging = staging_path(plan.target);
  for (const auto& file : plan.files) write_state_files(staging, file.stem, file.state, file.metadata);
}

/// Main process, once every rank's files are in: the manifest (with every file's size and
/// checksum, so a truncated file or one swapped in from another checkpoint of the same shapes
/// is refused by load_state), the atomic publication, then rotation of old automatic
/// checkpoints, so a crash never costs a complete checkpoint.
void publish_plan(const SavePlan& plan);

/// Writes every object's state into a staging folder, then (main process) the manifest, and
/// publishes the folder atomically; rotates old automatic checkpoints after that. Collective:
/// every rank calls it.
std::filesystem::path save_state(const StateSources& src, ProjectConfiguration& project,
                                 const std::optional<std::filesystem::path>& dir);

/// An asynchronous save in flight: this rank's writer thread. The main process's writer waits
/// for every rank's files (marker files in the staging folder, so no collective runs off the
/// training thread), then publishes as a synchronous save does. finish() is collective.
/// Example (what the accelerator does):
///   background.start(plan_save(src, project, dir, /*copy=*/true), timeout);   // returns at once
///   ...training...
///   background.finish(src);   // next save_state/load_state: waits, raises the writer's error
class BackgroundSave {
 public:
  BackgroundSave() = default;
  BackgroundSave(const BackgroundSave&) = delete;
  BackgroundSave& operator=(const BackgroundSave&) = delete;
  /// Waits for the writer; an error it met is printed (a destructor cannot raise it).
  ~BackgroundSave();

  /// Whether a save was started and not finished yet.
  bool pending() const noexcept { return thread_.joinable(); }

  /// The host copies of the last save, for the next one to copy into once this one is
  /// finished: mapping (and, for CUDA, pinning) fresh memory every save would cost about as
  /// much as the copy itself (bench/README.md). They stay allocated between saves.
  const std::vector<at::Tensor>& spares() const noexcept { return spares_; }

  /// Writes `plan` in a background thread; the main process then waits at most `timeout` for
  /// the other ranks' files.
  void start(SavePlan plan, std::chrono::milliseconds timeout);

  /// Waits for this rank's writer, then for every rank's (collective), and raises an error
  /// when this rank's writer failed or the checkpoint was not published.
  void finish(const StateSources& src);

 private:
  // The writer: this rank's files, then its marker; the main process waits for every rank's
  // marker and publishes. Returns the error met (empty when fine).
  static std::string write(const SavePlan& plan, std::chrono::milliseconds timeout);

  // Whether the target's manifest is this save's.
  bool published() const;

  std::thread thread_;
  std::string error_;  // written by the writer, read after join()
  std::filesystem::path target_;
  std::string save_id_;
  std::vector<at::Tensor> spares_;
};

/// save_state with SaveStateOptions::asynchronous: finishes the previous asynchronous save,
/// takes the state (tensors copied to host memory), and returns while `background` writes it.
std::filesystem::path save_state_async(const StateSources& src, ProjectConfiguration& project,
                                       const std::optional<std::filesystem::path>& dir,
                                       BackgroundSave& background);

/// The latest complete automatic checkpoint, or an error naming where it looked.
std::filesystem::path latest_checkpoint(const ProjectConfiguration& project);

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
std::filesystem::path load_state(const StateSources& src, ProjectConfiguration& project,
                                 const std::optional<std::filesystem::path>& dir,
                                 const LoadStateOptions& options = {});

}  // namespace accelerate::checkpoint

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/checkpoint/state.ipp>
#endif
