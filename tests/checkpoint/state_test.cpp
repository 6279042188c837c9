// Tests of save_state/load_state (checkpoint/state.hpp), optimizer state encoding,
// ProjectConfiguration numbering and rotation, Hana-derived state and registered objects.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

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

TEST(SaveState, Fp16ScalerIsSaved) {
  TempDir dir;
  accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp16> acc{{.cpu = true, .grad_scaler = {.init_scale = 64.0}}};
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

}  // namespace
