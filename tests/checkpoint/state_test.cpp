// Tests of save_state/load_state (checkpoint/state.hpp), optimizer state encoding,
// ProjectConfiguration numbering and rotation, Hana-derived state and registered objects.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>

#include "../support/models.hpp"
#include "../support/errors.hpp"
#include "../support/temp_dir.hpp"

// A plain struct, checkpointed member by member through Boost.Hana.
struct TrainingMeta {
  int64_t step = 0;
  double best_loss = 1e9;
  std::string run_name;
  torch::Tensor ema;
  std::vector<double> history;
  std::map<std::string, int64_t> counters;
  std::optional<std::string> note;
  std::vector<torch::Tensor> snapshots;
};
BOOST_HANA_ADAPT_STRUCT(TrainingMeta, step, best_loss, run_name, ema, history, counters, note, snapshots);

struct Outer {
  TrainingMeta inner;
  bool flag = false;
};
BOOST_HANA_ADAPT_STRUCT(Outer, inner, flag);

// One struct before and after it gained a member, as a program's next version has it.
struct RunInfoV1 {
  int64_t epoch = 0;
};
BOOST_HANA_ADAPT_STRUCT(RunInfoV1, epoch);
struct RunInfoV2 {
  int64_t epoch = 0;
  double warmup = 0;
};
BOOST_HANA_ADAPT_STRUCT(RunInfoV2, epoch, warmup);

namespace {

namespace ckpt = accelerate::checkpoint;
using accelerate::testing::TempDir;
using accelerate::testing::TinyNet;
using accelerate::testing::flat_parameters;
using accelerate::testing::regression_data;

using accelerate::testing::error_of;

template <class Optimizer, class Options>
void expect_optimizer_round_trip(const Options& options) {
  const auto data = regression_data(32);
  auto step = [&](TinyNet& net, torch::optim::Optimizer& opt) {
    opt.zero_grad();
    torch::mse_loss(net(data.inputs()), data.targets()).backward();
    opt.step();
  };
  torch::manual_seed(0);
  TinyNet a;
  Optimizer opt_a(a->parameters(), options);
  for (int i = 0; i < 3; ++i) step(a, opt_a);
  const auto saved = ckpt::optimizer_state_dict(opt_a);

  TinyNet b;
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < a->parameters().size(); ++i) b->parameters()[i].copy_(a->parameters()[i]);
  }
  Optimizer opt_b(b->parameters(), Options(123.0));  // different hyperparameters, restored by load
  ckpt::load_optimizer_state_dict(opt_b, saved);
  for (int i = 0; i < 3; ++i) {
    step(a, opt_a);
    step(b, opt_b);
  }
  EXPECT_TRUE(torch::equal(flat_parameters(*a), flat_parameters(*b))) << saved.values.dump();
}

TEST(OptimizerState, RoundTripsForEveryBuiltInOptimizer) {
  expect_optimizer_round_trip<torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true));
  expect_optimizer_round_trip<torch::optim::Adam>(torch::optim::AdamOptions(1e-2).amsgrad(true));
  expect_optimizer_round_trip<torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  expect_optimizer_round_trip<torch::optim::RMSprop>(torch::optim::RMSpropOptions(1e-3).momentum(0.5).centered(true));
  expect_optimizer_round_trip<torch::optim::Adagrad>(torch::optim::AdagradOptions(0.1));
}

TEST(OptimizerState, TypeMismatchIsAnError) {
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  torch::optim::Adam adam(net->parameters());
  EXPECT_NE(error_of([&] { ckpt::load_optimizer_state_dict(adam, ckpt::optimizer_state_dict(sgd)); })
                .find("saved by a SGD optimizer, loading into a Adam"),
            std::string::npos);
}

TEST(Reflect, HanaStructsRoundTripMemberByMember) {
  Outer saved;
  saved.inner = {7, 0.25, "run-a", torch::arange(4.0), {1.0, 2.0}, {{"skips", 3}}, "hello",
                 {torch::ones({2}), torch::zeros({1, 3})}};
  saved.flag = true;
  const auto state = accelerate::checkpoint::reflect_state_dict(saved);
  EXPECT_EQ(state.values["inner"]["step"], 7);
  EXPECT_TRUE(state.tensors.count("inner.ema"));
  EXPECT_TRUE(state.tensors.count("inner.snapshots.1"));
  Outer loaded;
  accelerate::checkpoint::reflect_load_state_dict(loaded, state);
  EXPECT_EQ(loaded.inner.step, 7);
  EXPECT_EQ(loaded.inner.best_loss, 0.25);
  EXPECT_EQ(loaded.inner.run_name, "run-a");
  EXPECT_TRUE(torch::equal(loaded.inner.ema, saved.inner.ema));
  EXPECT_EQ(loaded.inner.history, saved.inner.history);
  EXPECT_EQ(loaded.inner.counters, saved.inner.counters);
  EXPECT_EQ(loaded.inner.note, saved.inner.note);
  ASSERT_EQ(loaded.inner.snapshots.size(), 2u);
  EXPECT_TRUE(torch::equal(loaded.inner.snapshots[1], saved.inner.snapshots[1]));
  EXPECT_TRUE(loaded.flag);
}

// A user type with its own state_dict()/load_state_dict().
struct Counter {
  int64_t value = 0;
  accelerate::StateDict state_dict() const {
    accelerate::StateDict s;
    s.values["value"] = value;
    return s;
  }
  void load_state_dict(const accelerate::StateDict& s) { value = s.value<int64_t>("value"); }
};

using Acc = accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::Accumulate<2>>;

struct Trainer {
  explicit Trainer(const std::filesystem::path& project, std::optional<std::size_t> total_limit = std::nullopt)
      : acc{{.cpu = true, .seed = 1,
             .project = {.project_dir = project, .automatic_checkpoint_naming = true, .total_limit = total_limit}}} {}
  Acc acc;
};

TEST(SaveState, AutomaticNamingRotatesAndLoadsTheLatest) {
  TempDir dir;
  Trainer run(dir.path(), 2);
  TinyNet net;
  torch::optim::Adam adam(net->parameters());
  Counter counter;
  TrainingMeta meta;
  auto [model, opt] = run.acc.prepare(net, adam);
  run.acc.backward(model(torch::randn({2, 8})).sum());
  opt.step();  // Adam now has moments to save
  run.acc.register_for_checkpointing(counter);
  run.acc.register_for_checkpointing(meta);
  for (int i = 0; i < 4; ++i) {
    counter.value = i;
    meta.step = 10 * i;
    const auto path = run.acc.save_state();
    EXPECT_EQ(path.filename(), "checkpoint_" + std::to_string(i));
  }
  const auto kept = accelerate::checkpoint::list_checkpoints(dir / "checkpoints");
  ASSERT_EQ(kept.size(), 2u);  // total_limit
  EXPECT_EQ(kept[0].first, 2u);
  EXPECT_EQ(kept[1].first, 3u);
  for (const auto* file : {"model.safetensors", "optimizer.safetensors", "optimizer.json", "random_states_0.safetensors",
                           "random_states_0.json", "custom_checkpoint_0.json", "custom_checkpoint_1.json",
                           "accelerate_state.json"})
    EXPECT_TRUE(std::filesystem::exists(kept[1].second / file)) << file;

  // A crashed save leaves only a hidden staging folder, and a folder without a manifest is not
  // complete: neither is taken as the latest.
  std::filesystem::create_directories(dir / "checkpoints" / ".checkpoint_9.incomplete");
  std::filesystem::create_directories(dir / "checkpoints" / "checkpoint_8");
  std::filesystem::create_directories(dir / "checkpoints" / "notes");

  Trainer resumed(dir.path());
  TinyNet net2;
  torch::optim::Adam adam2(net2->parameters());
  Counter counter2;
  TrainingMeta meta2;
  auto [model2, opt2] = resumed.acc.prepare(net2, adam2);
  resumed.acc.register_for_checkpointing(counter2);
  resumed.acc.register_for_checkpointing(meta2);
  const auto loaded = resumed.acc.load_state();
  EXPECT_EQ(loaded.filename(), "checkpoint_3");
  EXPECT_EQ(counter2.value, 3);
  EXPECT_EQ(meta2.step, 30);
  EXPECT_TRUE(torch::equal(flat_parameters(*net), flat_parameters(*net2)));
  EXPECT_EQ(resumed.acc.project_configuration().iteration, 4u) << "numbering continues after the loaded one";
  EXPECT_NE(error_of([&] { resumed.acc.load_state(dir / "checkpoints" / "checkpoint_8"); })
                .find("is not a complete checkpoint (accelerate_state.json is missing"),
            std::string::npos);
}

TEST(SaveState, RestoresRngsAccumulationAndTheDataloaderPosition) {
  TempDir dir;
  const auto data = regression_data(64);
  // Trains the rest of the epoch; returns the inputs it saw.
  auto train = [](Acc& acc, auto& model, auto& opt, auto& loader, int save_after, std::filesystem::path* saved) {
    std::vector<torch::Tensor> seen;
    int k = 0;
    for (auto& [x, y] : loader) {
      auto step = acc.accumulate(model);
      acc.backward(torch::mse_loss(model(x), y));
      opt.step();
      opt.zero_grad();
      seen.push_back(x.clone());
      if (++k == save_after) *saved = acc.save_state();  // mid-epoch, on a boundary
    }
    return seen;
  };
  Trainer first(dir.path());
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto [model, opt, loader] = first.acc.prepare(net, sgd, accelerate::DataLoader(data, {.batch_size = 4, .shuffle = true}));
  std::filesystem::path saved;
  const auto straight = train(first.acc, model, opt, loader, 6, &saved);
  const auto draw = torch::rand({3});

  Trainer second(dir.path());
  TinyNet net2;
  torch::optim::SGD sgd2(net2->parameters(), 0.5);
  auto [model2, opt2, loader2] = second.acc.prepare(net2, sgd2, accelerate::DataLoader(data, {.batch_size = 4, .shuffle = true}));
  torch::rand({5});  // disturb the generator: load_state must restore it
  second.acc.load_state(saved);
  EXPECT_EQ(second.acc.step(), 6u) << "the micro-step counter at the save";
  EXPECT_EQ(loader2.batches_consumed(), 6u);
  std::filesystem::path unused;
  const auto resumed = train(second.acc, model2, opt2, loader2, -1, &unused);
  ASSERT_EQ(resumed.size(), straight.size() - 6);
  for (std::size_t i = 0; i < resumed.size(); ++i) EXPECT_TRUE(torch::equal(resumed[i], straight[i + 6])) << i;
  EXPECT_EQ(loader2.epoch(), 1u);
  EXPECT_TRUE(torch::equal(flat_parameters(*net), flat_parameters(*net2))) << "bit-exact resume";
  EXPECT_TRUE(torch::equal(torch::rand({3}), draw)) << "the generator continues where it was";
  EXPECT_DOUBLE_EQ(sgd2.param_groups()[0].options().get_lr(), 0.1) << "hyperparameters come from the checkpoint";
}

TEST(SaveState, BrokenOrForeignCheckpointsAreClearErrors) {
  TempDir dir;
  Trainer run(dir.path());
  TinyNet net;
  auto [model] = run.acc.prepare(net);
  const auto path = run.acc.save_state();

  // Another model.
  Trainer other(dir.path());
  TinyNet bigger(8, 32, 4);
  auto [model2] = other.acc.prepare(bigger);
  auto message = error_of([&] { other.acc.load_state(path); });
  EXPECT_NE(message.find("checkpoint_0/model.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("fc1.weight (module Float[32, 8], file Float[16, 8])"), std::string::npos) << message;

  // Another number of objects.
  Trainer fewer(dir.path());
  message = error_of([&] { fewer.acc.load_state(path); });
  EXPECT_NE(message.find("holds 1 model state(s); this accelerator has 0"), std::string::npos) << message;

  // Another world size.
  const auto manifest_path = path / "accelerate_state.json";
  auto manifest = ckpt::read_json_file(manifest_path);
  manifest["world_size"] = 2;
  std::ofstream(manifest_path) << manifest.dump();
  message = error_of([&] { run.acc.load_state(path); });
  EXPECT_NE(message.find("was saved by 2 process(es); this run has 1"), std::string::npos) << message;
  manifest["world_size"] = 1;
  std::ofstream(manifest_path) << manifest.dump();

  // A truncated file.
  std::filesystem::resize_file(path / "model.safetensors", std::filesystem::file_size(path / "model.safetensors") - 4);
  message = error_of([&] { run.acc.load_state(path); });
  EXPECT_NE(message.find("model.safetensors has"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated or replaced"), std::string::npos) << message;
}

// --- load_state is all or nothing ------------------------------------------------------------

// A registered object that refuses one value after changing itself (a half-done load): the
// last object load_state visits.
struct Picky {
  std::optional<int64_t> refuse;
  int64_t value = 0;
  accelerate::StateDict state_dict() const {
    accelerate::StateDict s;
    s.values["value"] = value;
    return s;
  }
  void load_state_dict(const accelerate::StateDict& s) {
    value = s.value<int64_t>("value");
    ACCELERATE_CHECK(value != refuse, "Picky refuses this state");
  }
};

// Everything a run has that load_state could change, to compare before and after.
struct Snapshot {
  torch::Tensor params, momentum, rng;
  std::size_t scheduler_steps, epoch, consumed, step;
  int64_t counter;
  bool operator==(const Snapshot& o) const {
    return torch::equal(params, o.params) && torch::equal(momentum, o.momentum) && torch::equal(rng, o.rng) &&
           scheduler_steps == o.scheduler_steps && epoch == o.epoch && consumed == o.consumed && step == o.step &&
           counter == o.counter;
  }
};

// A trained run with every kind of object, saved to `saved`, then trained further.
struct FullRun {
  Acc acc{{.cpu = true, .seed = 5}};
  TinyNet net;
  torch::optim::SGD sgd{net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};
  torch::optim::StepLR lr{sgd, 1, 0.9};
  Counter counter;
  Picky picky;
  decltype(acc.prepare(net, sgd, lr, accelerate::DataLoader(regression_data(64), {.batch_size = 8, .shuffle = true}))) prepared =
      acc.prepare(net, sgd, lr, accelerate::DataLoader(regression_data(64), {.batch_size = 8, .shuffle = true}));
  FullRun() {
    acc.register_for_checkpointing(counter);
    acc.register_for_checkpointing(picky);
  }
  void train(int batches) {
    auto& [model, opt, sched, loader] = prepared;
    for (auto& [x, y] : loader) {
      auto step = acc.accumulate(model);
      acc.backward(torch::mse_loss(model(x), y));
      opt.step();
      sched.step();
      opt.zero_grad();
      ++counter.value;
      if (--batches == 0) break;
    }
  }
  Snapshot snapshot() {
    auto& [model, opt, sched, loader] = prepared;
    const auto state = opt.state_dict();
    torch::Tensor momentum = torch::zeros({1});
    for (const auto& [key, t] : state.tensors) momentum = torch::cat({momentum, t.flatten()});
    // The generator's state, read without advancing it.
    const auto rng = at::detail::getDefaultCPUGenerator().get_state();
    return {accelerate::testing::flat_parameters(*net), momentum, rng,
            accelerate::compat::scheduler_step_count(lr), loader.epoch(), loader.batches_consumed(),
            acc.step(), counter.value};
  }
};

// Rewrites the manifest's size and checksum of a file that a test changed on purpose.
void reseal(const std::filesystem::path& checkpoint, const std::string& file) {
  auto manifest = ckpt::read_json_file(checkpoint / "accelerate_state.json");
  manifest["files"][file] = {{"bytes", std::filesystem::file_size(checkpoint / file)},
                             {"checksum", ckpt::file_checksum(checkpoint / file, "test")}};
  std::ofstream(checkpoint / "accelerate_state.json") << manifest.dump();
}

TEST(LoadStateAllOrNothing, AFailureInTheLastObjectUndoesEveryObjectBefore) {
  TempDir dir;
  FullRun run;
  run.train(3);
  run.acc.save_state(dir / "s");
  run.train(2);
  run.picky.value = 7;
  run.picky.refuse = 0;  // what the checkpoint holds
  const auto before = run.snapshot();
  const auto message = error_of([&] { run.acc.load_state(dir / "s"); });
  EXPECT_NE(message.find("custom_checkpoint_1.json: Picky refuses this state"), std::string::npos) << message;
  EXPECT_TRUE(run.snapshot() == before) << "a failed load changed the run";
  EXPECT_EQ(run.picky.value, 7) << "the failing object itself is restored";
  run.picky.refuse.reset();
  run.acc.load_state(dir / "s");
  EXPECT_FALSE(run.snapshot() == before) << "a good load changes it";
}

// A checkpoint saved before a registered struct gained a member: refused naming the member
// and the file, after which every object (the struct included) is as it was.
TEST(LoadStateAllOrNothing, AStructThatGainedAMemberIsRefusedAndChangesNothing) {
  TempDir dir;
  {
    RunInfoV1 info{.epoch = 3};
    FullRun old;
    old.acc.register_for_checkpointing(info);
    old.train(3);
    old.acc.save_state(dir / "s");
  }
  RunInfoV2 info{.epoch = 9, .warmup = 0.5};
  FullRun run;
  run.acc.register_for_checkpointing(info);
  run.train(5);
  const auto before = run.snapshot();
  const auto message = error_of([&] { run.acc.load_state(dir / "s"); });
  EXPECT_NE(message.find("custom_checkpoint_2.json"), std::string::npos) << message;
  EXPECT_NE(message.find("member 'warmup' is missing"), std::string::npos) << message;
  EXPECT_TRUE(run.snapshot() == before) << "a failed load changed the run";
  EXPECT_EQ(info.epoch, 9);
  EXPECT_EQ(info.warmup, 0.5);
}

TEST(LoadStateAllOrNothing, EveryRefusedCheckpointLeavesEveryObjectAsItWas) {
  TempDir dir;
  FullRun saver;
  saver.train(3);
  saver.acc.save_state(dir / "s");
  FullRun run;
  run.train(5);
  const auto before = run.snapshot();
  const auto s = dir / "s";
  auto refused = [&](const std::string& why, const std::string& expected) {
    const auto message = error_of([&] { run.acc.load_state(s); });
    EXPECT_NE(message.find(expected), std::string::npos) << why << ": " << message;
    EXPECT_TRUE(run.snapshot() == before) << why << ": a failed load changed the run";
  };
  auto edit_json = [&](const std::string& file, auto&& change) {
    auto json = ckpt::read_json_file(s / file);
    change(json);
    std::ofstream(s / file) << json.dump();
    if (file != "accelerate_state.json") reseal(s, file);
  };
  const auto pristine = dir / "pristine";
  std::filesystem::copy(s, pristine, std::filesystem::copy_options::recursive);
  auto restore = [&] {
    std::filesystem::remove_all(s);
    std::filesystem::copy(pristine, s, std::filesystem::copy_options::recursive);
  };

  // A custom object's JSON with a wrong type (after models, optimizers and schedulers).
  edit_json("custom_checkpoint_0.json", [](auto& j) { j["value"] = "twelve"; });
  refused("wrong JSON type", "value 'value' has the wrong type");
  restore();
  // An RNG state of the wrong size (a raw c10::Error before).
  ckpt::save_safetensors(s / "random_states_0.safetensors", {{"cpu", torch::zeros({7}, torch::kByte)}});
  reseal(s, "random_states_0.safetensors");
  refused("RNG state size", "random_states_0.safetensors: the state of generator 'cpu'");
  restore();
  // A negative epoch and a changed shuffle in the dataloader's state.
  edit_json("dl_state_dict.json", [](auto& j) { j["epoch"] = -1; });
  refused("negative epoch", "value 'epoch' is -1, expected a natural number");
  restore();
  edit_json("dl_state_dict.json", [](auto& j) { j["shuffle"] = false; });
  refused("changed shuffle", "saved with shuffle = false, this loader has shuffle = true");
  restore();
  // Another batch size.
  edit_json("dl_state_dict.json", [](auto& j) { j["batch_size"] = 4; });
  refused("batch size", "in batches of 4, this loader has 64 samples in batches of 8");
  restore();
  // A model file swapped in from another checkpoint of the same shapes.
  {
    FullRun other;
    other.train(1);
    other.acc.save_state(dir / "other");
  }
  std::filesystem::copy_file(dir / "other" / "model.safetensors", s / "model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  refused("swapped model file", "model.safetensors has checksum");
  restore();
  // Another configuration (the fingerprint), refused unless allowed.
  edit_json("accelerate_state.json", [](auto& j) { j["configuration"] = "Backend=SingleProcess Precision=Fp16"; });
  refused("configuration", "was saved by another configuration");
  EXPECT_NO_THROW(run.acc.load_state(s, {.allow_configuration_change = true}));
  restore();
}

TEST(LoadStateAllOrNothing, AnFp32CheckpointIsRefusedByAnFp16Run) {
  TempDir dir;
  {
    accelerate::Accelerator<> fp32{{.cpu = true}};
    TinyNet net;
    torch::optim::SGD sgd(net->parameters(), 0.1);
    auto [model, opt] = fp32.prepare(net, sgd);
    fp32.save_state(dir / "s");
  }
  accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp16> fp16{{.cpu = true}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt] = fp16.prepare(net, sgd);
  const auto before = accelerate::testing::flat_parameters(*net);
  EXPECT_NE(error_of([&] { fp16.load_state(dir / "s"); }).find("another configuration"), std::string::npos);
  // Even when the change is allowed, the missing scaler is found before anything changes.
  EXPECT_NE(error_of([&] { fp16.load_state(dir / "s", {.allow_configuration_change = true}); }).find("scaler"),
            std::string::npos);
  EXPECT_TRUE(torch::equal(before, accelerate::testing::flat_parameters(*net)));
}

TEST(LoadStateAllOrNothing, AFifoInTheFolderIsRefusedAtOnce) {
  TempDir dir;
  FullRun run;
  run.acc.save_state(dir / "s");
  std::filesystem::remove(dir / "s" / "scheduler.json");
  ASSERT_EQ(::mkfifo((dir / "s" / "scheduler.json").c_str(), 0600), 0);
  const auto message = error_of([&] { run.acc.load_state(dir / "s"); });
  EXPECT_NE(message.find("scheduler.json"), std::string::npos) << message;
  EXPECT_NE(message.find("not a regular file"), std::string::npos) << message;
}

TEST(SaveState, ExplicitFolderIsReplacedAtomically) {
  TempDir dir;
  accelerate::Accelerator<> acc{{.cpu = true}};
  TinyNet net;
  auto [model] = acc.prepare(net);
  acc.save_state(dir / "state");
  {
    torch::NoGradGuard no_grad;
    net->fc1->weight.fill_(3.0);
  }
  acc.save_state(dir / "state");  // over the previous one
  TinyNet other;
  accelerate::load_checkpoint_in_model(*other, dir / "state" / "model.safetensors");
  EXPECT_EQ(other->fc1->weight[0][0].item<float>(), 3.0f);
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1u) << "no staging or previous folder left behind";
}

// A save hook keeps a file of its own in the checkpoint: written into the staged folder, so it
// is published atomically with the rest and checksummed; a load hook reads it before any
// object is restored, and an error it raises leaves everything as it was. Removed, neither runs.
TEST(StateHooks, KeepAFileOfTheirOwnInTheCheckpointUntilRemoved) {
  TempDir dir;
  accelerate::Accelerator<> acc{{.cpu = true}};
  TinyNet net;
  auto [model] = acc.prepare(net);
  std::vector<std::string> calls;
  int note = 7;
  auto save_hook = acc.register_save_state_pre_hook([&](const std::filesystem::path& staged) {
    calls.push_back("save");
    EXPECT_FALSE(std::filesystem::exists(staged / "model.safetensors")) << "the hook runs before the state is written";
    std::ofstream(staged / "notes.json") << nlohmann::json{{"note", note}}.dump();
  });
  auto load_hook = acc.register_load_state_pre_hook([&](const std::filesystem::path& folder) {
    calls.push_back("load");
    note = nlohmann::json::parse(std::ifstream(folder / "notes.json")).at("note").get<int>();
  });
  acc.save_state(dir / "a");
  EXPECT_TRUE(std::filesystem::exists(dir / "a" / "notes.json"));
  note = 0;
  acc.load_state(dir / "a");
  EXPECT_EQ(note, 7);
  EXPECT_EQ(calls, (std::vector<std::string>{"save", "load"}));

  // Asynchronous saves run it too, on the calling thread.
  acc.save_state(dir / "async", {.asynchronous = true});
  acc.wait_for_save();
  EXPECT_TRUE(std::filesystem::exists(dir / "async" / "notes.json"));

  // The manifest checksums the hook's file: a changed one is refused before the hook runs.
  std::ofstream(dir / "a" / "notes.json") << R"({"note": 8})";
  EXPECT_THROW(acc.load_state(dir / "a"), accelerate::Error);
  EXPECT_EQ(calls.size(), 3u);

  // A load hook that raises fails load_state with every object as it was.
  auto failing = acc.register_load_state_pre_hook([](const std::filesystem::path&) {
    throw accelerate::Error("notes.json: not what this run expects");
  });
  {
    torch::NoGradGuard no_grad;
    net->fc1->weight.add_(1.0);
  }
  const auto changed = flat_parameters(*net).clone();
  EXPECT_THROW(acc.load_state(dir / "async"), accelerate::Error);
  EXPECT_TRUE(torch::equal(flat_parameters(*net), changed));
  failing.remove();

  save_hook.remove();
  load_hook.remove();
  load_hook.remove();  // a second time does nothing
  const auto count = calls.size();
  acc.save_state(dir / "b");
  acc.load_state(dir / "b");
  EXPECT_FALSE(std::filesystem::exists(dir / "b" / "notes.json"));
  EXPECT_EQ(calls.size(), count);
}

TEST(SaveState, Fp16ScalerIsSaved) {
  TempDir dir;
  accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp16> acc{{.cpu = true, .precision = {.grad_scaler = {.init_scale = 64.0}}}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, sgd);
  acc.backward(model(torch::randn({2, 8})).sum() * std::numeric_limits<float>::infinity());
  opt.step();  // skipped: scale 32
  acc.save_state(dir / "s");
  accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp16> other{{.cpu = true}};
  TinyNet net2;
  torch::optim::SGD sgd2(net2->parameters(), 0.1);
  auto [model2, opt2] = other.prepare(net2, sgd2);
  other.load_state(dir / "s");
  EXPECT_DOUBLE_EQ(other.loss_scale(), 32.0);
  EXPECT_TRUE(std::filesystem::exists(dir / "s" / "scaler.json"));
}

// A registered object that keeps the tensor load_state handed it and updates it in place
// later (an EMA): this crashed with SIGSEGV when tensors were views of a read-only mapping.
struct Ema {
  at::Tensor average = torch::zeros({4});
  accelerate::StateDict state_dict() const {
    accelerate::StateDict s;
    s.tensors["average"] = average;
    return s;
  }
  void load_state_dict(const accelerate::StateDict& s) { average = s.tensor("average"); }
};

TEST(SaveState, AnObjectMayKeepAndModifyTheTensorsItLoaded) {
  TempDir dir;
  accelerate::Accelerator<> acc{{.cpu = true}};
  Ema ema;
  ema.average.fill_(2.0);
  acc.register_for_checkpointing(ema);
  acc.save_state(dir / "s");
  ema.average = torch::zeros({4});
  acc.load_state(dir / "s");
  ema.average.mul_(0.5).add_(1.0);
  EXPECT_TRUE(torch::equal(ema.average, torch::full({4}, 2.0)));
  acc.load_state(dir / "s");  // the file was not changed by the update
  EXPECT_TRUE(torch::equal(ema.average, torch::full({4}, 2.0)));
}

// The registry's owners: an entry every rank owns gets a file per rank (a sharded optimizer's
// shard, say) and is written even by a rank that does not write replicated state.
TEST(CheckpointRegistry, EntriesOwnedByEveryRankGetAFileOfTheirOwnAndLoadBack) {
  using Kind = ckpt::Entry::Kind;
  TempDir dir;
  Counter shared{3}, own{7};
  ckpt::Registry registry;
  registry.add(Kind::custom, ckpt::EntryOwner::main_rank, std::ref(shared));
  registry.add(Kind::custom, ckpt::EntryOwner::every_rank, std::ref(own));
  EXPECT_EQ(registry.count(Kind::custom), 2u);
  accelerate::ProjectConfiguration project;
  const ckpt::StateSources writer{&registry, 0, 1, true, "registry test", [] {}};
  ckpt::save_state(writer, project, dir / "a");
  EXPECT_TRUE(std::filesystem::exists(dir / "a" / "custom_checkpoint_0.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "a" / "custom_checkpoint_1_rank0.json"));
  shared.value = 0;
  own.value = 0;
  ckpt::load_state(writer, project, dir / "a");
  EXPECT_EQ(shared.value, 3);
  EXPECT_EQ(own.value, 7);

  const ckpt::StateSources not_writer{&registry, 0, 1, false, "registry test", [] {}};
  ckpt::save_state(not_writer, project, dir / "b");
  EXPECT_FALSE(std::filesystem::exists(dir / "b" / "custom_checkpoint_0.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "b" / "custom_checkpoint_1_rank0.json"));
}

// A rank a checkpoint has no RNG state for (resumed on more processes) derives one: the same
// on every resume, different per rank and from the saved rank 0's stream.
TEST(DerivedRngState, IsDeterministicAndDistinctPerRank) {
  torch::manual_seed(3);
  const auto saved = ckpt::rng_state();
  const auto draw = [](const accelerate::StateDict& state) {
    ckpt::load_rng_state(state, "test");
    return torch::randn({4});
  };
  const auto rank0 = draw(saved);
  const auto rank2 = draw(ckpt::derived_rng_state(saved, 2, "test"));
  EXPECT_TRUE(torch::equal(rank2, draw(ckpt::derived_rng_state(saved, 2, "test"))));
  EXPECT_FALSE(torch::equal(rank2, draw(ckpt::derived_rng_state(saved, 3, "test"))));
  EXPECT_FALSE(torch::equal(rank2, rank0));
  torch::manual_seed(4);  // another saved state derives another stream for the same rank
  EXPECT_FALSE(torch::equal(rank2, draw(ckpt::derived_rng_state(ckpt::rng_state(), 2, "test"))));
}

// --- asynchronous saves ------------------------------------------------------------------------

TEST(AsyncSave, WritesWhatWasThereWhenCalledAndTheNextCallWaits) {
  TempDir dir;
  Trainer run(dir.path());
  TinyNet net;
  torch::optim::Adam adam(net->parameters());
  Counter counter;
  auto [model, opt] = run.acc.prepare(net, adam);
  run.acc.register_for_checkpointing(counter);
  run.acc.backward(model(torch::randn({2, 8})).sum());
  opt.step();
  counter.value = 7;
  const auto saved = flat_parameters(*net);
  const auto path = run.acc.save_state(std::nullopt, {.asynchronous = true});
  EXPECT_EQ(path.filename(), "checkpoint_0");
  {  // training goes on at once, changing what the writer must not see
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) p.fill_(-1);
  }
  counter.value = 8;
  // load_state waits for the writer, then reads the complete folder.
  EXPECT_EQ(run.acc.load_state(), path);
  EXPECT_TRUE(torch::equal(flat_parameters(*net), saved));
  EXPECT_EQ(counter.value, 7);
  for (const auto& entry : std::filesystem::directory_iterator(path))
    EXPECT_FALSE(entry.path().filename().string().starts_with(".")) << "a marker was published: " << entry.path();

  // The next automatic save is numbered after it; the destructor waits for the last writer.
  std::filesystem::path last;
  {
    Trainer other(dir.path());
    TinyNet net2;
    auto [model2] = other.acc.prepare(net2);
    last = other.acc.save_state(std::nullopt, {.asynchronous = true});
  }
  EXPECT_EQ(last.filename(), "checkpoint_1");
  EXPECT_TRUE(std::filesystem::exists(last / "accelerate_state.json")) << "complete once the accelerator is gone";
  EXPECT_EQ(ckpt::list_checkpoints(dir / "checkpoints").size(), 2u);
}


}  // namespace
