// Bodies of state.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/checkpoint/state.hpp>

namespace accelerate::checkpoint {

ACCELERATE_INLINE std::string state_stem(Entry::Kind kind, std::size_t index) {
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
    case Kind::precision: return numbered("precision");
    case Kind::micro_step:
    case Kind::gradient_sync: return "random_states";
  }
  return "unknown";
}

ACCELERATE_INLINE const char* kind_name(Entry::Kind kind) {
  using Kind = Entry::Kind;
  switch (kind) {
    case Kind::model: return "model";
    case Kind::optimizer: return "optimizer";
    case Kind::scheduler: return "scheduler";
    case Kind::dataloader: return "dataloader";
    case Kind::custom: return "custom";
    case Kind::precision: return "precision";
    case Kind::micro_step: return "micro_step";
    case Kind::gradient_sync: return "gradient_sync";
  }
  return "unknown";
}

ACCELERATE_INLINE void write_json_file(const std::filesystem::path& path, const nlohmann::json& json) {
  {
    std::ofstream out(path);
    out << json.dump(2) << '\n';
    out.flush();
    ACCELERATE_CHECK(out.good(), "checkpoint: writing ", path.string(), " failed (disk full?)");
  }
  fsync_path(path);
}

ACCELERATE_INLINE nlohmann::json read_json_file(const std::filesystem::path& path) {
  const std::string text = read_regular_file(path, "checkpoint");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    detail::fail("checkpoint: ", path.string(), " is not valid JSON (", e.what(), ")");
  }
}

ACCELERATE_INLINE StateDict read_state_files(const std::filesystem::path& dir, const std::string& stem) {
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

ACCELERATE_INLINE StateDict rng_state() {
  StateDict state;
  auto generators = detail::all_generators();
  for (std::size_t i = 0; i < generators.size(); ++i) {
    std::lock_guard<std::mutex> lock(generators[i].mutex());
    state.tensors[i == 0 ? "cpu" : "cuda_" + std::to_string(i - 1)] = generators[i].get_state();
  }
  return state;
}

ACCELERATE_INLINE void check_rng_state(const StateDict& state, const std::string& file) {
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

ACCELERATE_INLINE StateDict derived_rng_state(const StateDict& rank0, int rank, const std::string& file) {
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

ACCELERATE_INLINE void load_rng_state(const StateDict& state, const std::string& file) {
  check_rng_state(state, file);
  auto generators = detail::all_generators();
  for (std::size_t i = 0; i < generators.size(); ++i) {
    const std::string key = i == 0 ? "cpu" : "cuda_" + std::to_string(i - 1);
    std::lock_guard<std::mutex> lock(generators[i].mutex());
    generators[i].set_state(state.tensors.at(key).clone());
  }
}

ACCELERATE_INLINE std::filesystem::path state_target(ProjectConfiguration& project,
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

ACCELERATE_INLINE at::Tensor host_copy(const at::Tensor& t, const at::Tensor& spare) {
  if (!t.defined()) return t;
  const at::Tensor source = t.detach();
  const bool fits = spare.defined() && spare.sizes() == source.sizes() && spare.dtype() == source.dtype() &&
                    spare.is_contiguous();
  at::Tensor host = fits ? spare
                         : at::empty(source.sizes(), source.options().device(at::kCPU).pinned_memory(source.is_cuda()));
  // Fresh memory is mapped in one call before the copy (pinned memory is mapped already): a
  // process's first asynchronous save, which makes its host buffers, then blocks the loop
  // for little more than a later one, which copies into them again.
  if (!fits && !source.is_cuda()) detail::populate_pages(host.data_ptr(), host.nbytes());
  host.copy_(source);
  return host;
}

ACCELERATE_INLINE SavePlan plan_save(const StateSources& src, ProjectConfiguration& project,
                                     const std::optional<std::filesystem::path>& dir, bool copy,
                                     const std::vector<at::Tensor>& spares) {
  namespace fs = std::filesystem;
  SavePlan plan;
  plan.target = state_target(project, dir);
  plan.rank = src.rank;
  plan.world_size = src.world_size;
  const fs::path staging = staging_path(plan.target);
  agreed_step(src, "save_state: making the staging folder of " + plan.target.string(), [&] {
    if (src.rank != 0) return;
    const fs::path parent = plan.target.parent_path().empty() ? fs::path(".") : plan.target.parent_path();
    fs::create_directories(parent);
    if (!dir) {  // leftovers of saves or rotations a crash interrupted
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator(parent, ec)) {
        const auto name = entry.path().filename().string();
        if (name.starts_with(".checkpoint_") && (name.ends_with(".incomplete") || name.ends_with(".deleting")))
          fs::remove_all(entry.path(), ec);
      }
    }
    begin_staging(plan.target);
    std::random_device entropy;
    const auto id = (static_cast<std::uint64_t>(entropy()) << 32) ^ entropy();
    std::ofstream(staging / save_id_marker) << id;
  });
  // From here a failure anywhere leaves the previous checkpoint as it was: the staging folder goes.
  const auto abandon = [&] {
    std::error_code ec;
    if (src.rank == 0) fs::remove_all(staging, ec);
  };
  agreed_step(src, "save_state: taking the state of every object", [&] {
    std::ifstream in(staging / save_id_marker);
    in >> plan.save_id;
    ACCELERATE_CHECK(!plan.save_id.empty(), "save_state: ", (staging / save_id_marker).string(), " is missing "
                     "(the checkpoint folder must be on a file system every rank sees)");
    take_state(src, plan, copy, spares);
  }, abandon);
  if (!dir && project.total_limit) {
    plan.rotate_under = project.project_dir / "checkpoints";
    plan.total_limit = project.total_limit;
  }
  ++project.iteration;
  return plan;
}

ACCELERATE_INLINE void take_state(const StateSources& src, SavePlan& plan, bool copy,
                                  const std::vector<at::Tensor>& spares) {
  // Objects and the scaler get a file each, written by the ranks that own them; this rank's
  // own step states (the micro-step counter) join its RNGs in random_states_<rank>.
  auto taken = [&](StateDict state) {
    if (!copy) return state;
    for (auto& [key, t] : state.tensors) {
      const std::size_t k = plan.host_copies.size();
      t = host_copy(t, k < spares.size() ? spares[k] : at::Tensor());
      plan.host_copies.push_back(t);
    }
    return state;
  };
  std::map<Entry::Kind, std::size_t> counts;
  StateDict per_rank = rng_state();
  for (const auto* list : {&src.registry->objects(), &src.registry->step_states()}) {
    for (const auto& entry : *list) {
      const std::size_t index = counts[entry.kind]++;
      if (in_rank_file(entry)) {
        StateDict state = entry.save();
        per_rank.values.update(state.values);
        for (auto& [key, tensor] : state.tensors) per_rank.tensors[key] = std::move(tensor);
        continue;
      }
      if (entry.owner == EntryOwner::main_rank && !src.writes_replicated_state) continue;
      const bool model = entry.kind == Entry::Kind::model;
      plan.files.push_back({entry_stem(entry, index, src.rank), taken(entry.save()),
                            model ? std::map<std::string, std::string>{{"format", "pt"}}
                                  : std::map<std::string, std::string>{}});
    }
  }
  plan.files.push_back({"random_states_" + std::to_string(src.rank), std::move(per_rank), {}});

  nlohmann::json objects = nlohmann::json::object();
  for (const auto& [kind, n] : counts)
    if (!is_step_state(kind)) objects[kind_name(kind)] = n;
  plan.manifest = {{"format", state_format},
                   {"library", std::string("accelerate-cpp ") + version_string},
                   {"world_size", src.world_size},
                   {"configuration", src.configuration},
                   {"objects", objects},
                   {"save_id", plan.save_id}};
}

ACCELERATE_INLINE void agreed_step(const StateSources& src, const std::string& doing,
                                   const std::function<void()>& step, const std::function<void()>& on_failure) {
  std::exception_ptr failure;
  try {
    step();
  } catch (...) {
    failure = std::current_exception();
  }
  const bool failed_here = failure != nullptr;
  const int first = src.first_failed_rank ? src.first_failed_rank(failed_here) : failed_here ? src.rank : -1;
  if (first < 0) return;
  if (on_failure) {
    on_failure();
    src.barrier();  // every rank raises once the cleanup is done
  }
  if (failure) std::rethrow_exception(failure);
  detail::fail(doing, ": rank ", first, " failed (its own error names the cause); no checkpoint was published "
               "and the previous one is as it was");
}

ACCELERATE_INLINE void publish_plan(const SavePlan& plan) {
  namespace fs = std::filesystem;
  const auto staging = staging_path(plan.target);
  std::error_code ec;
  fs::remove(staging / save_id_marker, ec);
  nlohmann::json files = nlohmann::json::object();
  for (const auto& file : fs::directory_iterator(staging)) {
    const auto name = file.path().filename().string();
    if (name.starts_with(".")) continue;  // markers of an asynchronous save
    files[name] = {{"bytes", fs::file_size(file.path())}, {"checksum", file_checksum(file.path(), "save_state")}};
  }
  nlohmann::json manifest = plan.manifest;
  manifest["files"] = std::move(files);
  write_json_file(staging / std::string(manifest_name), manifest);
  commit_staging(plan.target);
  if (plan.rotate_under) {
    // Renamed out of sight first: a crash while deleting must not leave a partial folder
    // that still looks like a checkpoint.
    auto complete = list_checkpoints(*plan.rotate_under);
    for (std::size_t i = 0; i + *plan.total_limit < complete.size(); ++i) {
      const auto& old = complete[i].second;
      // Appended piece by piece: GCC 12 warns (-Wstringop-overflow, a false positive) on
      // "." + name + ".deleting" once enough of this function is inlined.
      std::string hidden = ".";
      hidden.append(old.filename().string()).append(".deleting");
      const auto doomed = old.parent_path() / hidden;
      fs::remove_all(doomed, ec);
      fs::rename(old, doomed);
      fs::remove_all(doomed, ec);
    }
  }
}

ACCELERATE_INLINE std::filesystem::path save_state(const StateSources& src, ProjectConfiguration& project,
                                                   const std::optional<std::filesystem::path>& dir) {
  namespace fs = std::filesystem;
  const SavePlan plan = plan_save(src, project, dir, /*copy=*/false);
  const fs::path staging = staging_path(plan.target);
  const auto abandon = [&] {
    std::error_code ec;
    if (src.rank == 0) fs::remove_all(staging, ec);
  };
  agreed_step(src, "save_state: writing " + staging.string(), [&] {
    if (src.before_save) src.before_save(staging);
    write_planned_files(plan);
  }, abandon);
  agreed_step(src, "save_state: publishing " + plan.target.string(), [&] {
    if (src.rank == 0) publish_plan(plan);
  }, abandon);
  return plan.target;
}

ACCELERATE_INLINE BackgroundSave::~BackgroundSave() {
  if (!thread_.joinable()) return;
  thread_.join();
  if (!error_.empty())
    std::cerr << "accelerate: the asynchronous save_state of " << target_.string() << " failed: " << error_ << std::endl;
}

ACCELERATE_INLINE void BackgroundSave::start(SavePlan plan, std::chrono::milliseconds timeout) {
  ACCELERATE_CHECK(!pending(), "save_state: the previous asynchronous save was not finished");
  target_ = plan.target;
  save_id_ = plan.save_id;
  spares_ = plan.host_copies;
  error_.clear();
  thread_ = std::thread([this, plan = std::move(plan), timeout] { error_ = write(plan, timeout); });
}

ACCELERATE_INLINE void BackgroundSave::finish(const StateSources& src) {
  if (!pending()) return;
  thread_.join();
  src.barrier();  // every rank's writer is done, the main process's publication included
  const std::string error = std::exchange(error_, {});
  ACCELERATE_CHECK(error.empty(), "save_state (asynchronous) of ", target_.string(), " failed: ", error);
  ACCELERATE_CHECK(published(), "save_state (asynchronous): ", target_.string(), " was not completed: "
                   "another rank's writer failed (its error names the file); the previous checkpoint is intact");
}

ACCELERATE_INLINE std::string BackgroundSave::write(const SavePlan& plan, std::chrono::milliseconds timeout) {
  namespace fs = std::filesystem;
  const auto staging = staging_path(plan.target);
  try {
    write_planned_files(plan);
    if (plan.rank != 0) {
      std::ofstream(save_marker(staging, "done", plan.rank)) << "done\n";
      return {};
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (int r = 1; r < plan.world_size; ++r) {
      for (;;) {
        std::error_code ec;
        if (fs::exists(save_marker(staging, "done", r), ec)) break;
        if (fs::exists(save_marker(staging, "failed", r), ec)) {
          std::ifstream in(save_marker(staging, "failed", r));
          std::string message((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
          accelerate::detail::fail("rank ", r, "'s writer failed: ", message);
        }
        ACCELERATE_CHECK(std::chrono::steady_clock::now() < deadline, "rank ", r, " did not finish writing its "
                         "files into ", staging.string(), " within ", timeout.count(), " ms");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    std::error_code ec;
    for (int r = 1; r < plan.world_size; ++r) fs::remove(save_marker(staging, "done", r), ec);
    publish_plan(plan);
    return {};
  } catch (const std::exception& e) {
    if (plan.rank != 0) {
      std::ofstream failed(save_marker(staging, "failed", plan.rank));
      failed << e.what();
    }
    return e.what();
  }
}

ACCELERATE_INLINE bool BackgroundSave::published() const {
  std::ifstream in(target_ / std::string(manifest_name));
  if (!in) return false;
  try {
    return nlohmann::json::parse(in).value("save_id", std::string()) == save_id_;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

ACCELERATE_INLINE std::filesystem::path save_state_async(const StateSources& src, ProjectConfiguration& project,
                                                         const std::optional<std::filesystem::path>& dir,
                                                         BackgroundSave& background) {
  background.finish(src);
  SavePlan plan = plan_save(src, project, dir, /*copy=*/true, background.spares());
  agreed_step(src, "save_state: preparing " + staging_path(plan.target).string(), [&] {
    if (src.before_save) src.before_save(staging_path(plan.target));  // on the training thread
  }, [&] {
    std::error_code ec;
    if (src.rank == 0) std::filesystem::remove_all(staging_path(plan.target), ec);
  });
  auto target = plan.target;
  background.start(std::move(plan), src.timeout);
  return target;
}

ACCELERATE_INLINE std::filesystem::path latest_checkpoint(const ProjectConfiguration& project) {
  ACCELERATE_CHECK(project.automatic_checkpoint_naming, "load_state: no folder given, and "
                   "ProjectConfiguration::automatic_checkpoint_naming is off");
  const auto base = project.project_dir / "checkpoints";
  const auto complete = list_checkpoints(base);
  ACCELERATE_CHECK(!complete.empty(), "load_state: no complete checkpoint under ", base.string());
  return complete.back().second;
}

ACCELERATE_INLINE std::filesystem::path load_state(const StateSources& src, ProjectConfiguration& project,
                                                   const std::optional<std::filesystem::path>& dir,
                                                   const LoadStateOptions& options) {
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

  if (src.before_load) src.before_load(source);

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
      bool recut = false;
      with_files(p.files, [&] {
        p.state = read_state_files(source, stem);
        recut = entry.reshard && entry.laid_out_otherwise && entry.laid_out_otherwise(p.state);
        if (!recut && entry.check) entry.check(p.state);
      });
      pending.push_back(recut ? resharded(entry, index, source, saved_world, with_files) : std::move(p));
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
