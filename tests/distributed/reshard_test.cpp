// Resuming on another number of processes (LoadStateOptions::allow_world_size_change), with
// real processes: a checkpoint saved asynchronously by 2 ranks mid-epoch (training goes on while
// it is written) loads on 1, 3 and 4 ranks and back on 2, for data parallel and ZeRO stages 1
// and 2. The checkpoint holds the parameters of the moment of the call; the model and the
// optimizer state (assembled from every rank's slices) are exactly the saved ones, the rest of
// the epoch yields exactly the samples not yet seen, the next epoch is a fresh run's, and the
// resumed run ends where a run of the new size resuming its own checkpoint does.
#include <accelerate/accelerate.hpp>
#include <accelerate/distributed/sharded.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "../support/errors.hpp"
#include "../support/indexed_dataset.hpp"
#include "../support/prelude.hpp"
#include "../support/temp_dir.hpp"

namespace {

using namespace accelerate::testing::prelude;

constexpr int64_t kSamples = 48, kBatch = 2;  // per-rank batch
constexpr int kFirstSteps = 6;                // on 2 ranks: 24 samples, and 24 left (2*1, 2*3, 2*4 divide it)
constexpr std::uint64_t kShuffleSeed = 7;

// Samples that carry their own index, so each rank can log what it was given.
accelerate::testing::IndexedDataset indexed_data() {
  return {at::randn({kSamples, 6}, at::make_generator<at::CPUGeneratorImpl>(11)),
          at::randn({kSamples, 3}, at::make_generator<at::CPUGeneratorImpl>(12))};
}

std::string arg(std::size_t n) {  // run_job passes one argument per line
  std::string args = std::getenv("ACCELERATE_TEST_ARGS");
  for (std::size_t i = 0; i < n; ++i) args = args.substr(args.find('\n') + 1);
  return args.substr(0, args.find('\n'));
}

template <class Backend>
int reshard_phase(const std::string& phase) {
  const std::filesystem::path shared = std::getenv("RESHARD_TEST_SHARED");
  accelerate::AcceleratorOptions options;
  options.process_group.timeout = 60s;
  options.ddp.first_bucket_cap_bytes = 40;  // several buckets: slices that cut parameters
  options.ddp.bucket_cap_bytes = 100;
  accelerate::Accelerator<Backend> acc{options};
  torch::manual_seed(5);
  TinyNet net(6, 5, 3);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  auto [model, opt, loader] = acc.prepare(
      net, optimizer, accelerate::DataLoader(indexed_data(), {.batch_size = kBatch, .shuffle = true, .seed = kShuffleSeed}));
  const std::string rank = std::to_string(acc.process_index());
  auto train = [&](const std::string& log, int max_steps) {
    std::ofstream seen(shared / (log + "_rank" + rank + ".txt"));
    int steps = 0;
    for (auto& [x, y, index] : loader) {
      for (int64_t i = 0; i < index.numel(); ++i) seen << index[i].template item<int64_t>() << "\n";
      acc.backward(torch::mse_loss(model(x), y));
      opt.step();
      opt.zero_grad();
      if (++steps == max_steps) break;
    }
  };
  if (phase == "first") {  // saved asynchronously: training goes on while the writers run
    train("seen_first", kFirstSteps);
    save_tensor(job_dir() / ("at_save_rank" + rank + ".bin"), flat_parameters(*net));
    acc.save_state(shared / "saved", {.asynchronous = true});
    train("after_save", 2);
    return 0;  // the accelerator's destructor waits for the writer
  }
  if (phase == "second") {
    acc.load_state(shared / "saved", {.allow_world_size_change = true});
    acc.save_state(shared / "resaved");  // the loaded state, as this world size writes it
    train("seen_second", -1);
    save_tensor(job_dir() / ("end_rank" + rank + ".bin"), flat_parameters(*net));
    train("seen_next_epoch", -1);
    return 0;
  }
  if (phase == "third") {  // resumes what this world size wrote: no resharding
    acc.load_state(shared / "resaved");
    train("seen_third", -1);
    save_tensor(job_dir() / ("end_rank" + rank + ".bin"), flat_parameters(*net));
    return 0;
  }
  if (phase == "back") {
    acc.load_state(shared / "resaved", {.allow_world_size_change = true});
    acc.save_state(shared / "back");
    return 0;
  }
  if (phase == "refused") {  // a change of world size must be asked for
    const auto error = accelerate::testing::error_of([&] { acc.load_state(shared / "saved"); });
    std::cerr << error << "\n";
    return error.find("saved by 2 process(es)") != std::string::npos &&
                   error.find("allow_world_size_change") != std::string::npos
               ? 0
               : 3;
  }
  return 2;
}

ACCELERATE_WORKER(reshard) {
  const std::string backend = arg(1);
  if (backend == "zero1") return reshard_phase<accelerate::Zero<accelerate::Gloo, 1>>(arg(0));
  if (backend == "zero2") return reshard_phase<accelerate::Zero<accelerate::Gloo, 2>>(arg(0));
  return reshard_phase<accelerate::Gloo>(arg(0));
}

std::vector<int64_t> read_indices(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::vector<int64_t> out;
  for (int64_t i; in >> i;) out.push_back(i);
  return out;
}

nlohmann::json read_json(const std::filesystem::path& file) {
  std::ifstream in(file);
  return nlohmann::json::parse(in);
}

// The optimizer state of a checkpoint as whole parameters: "<model>.<parameter>/<field>" ->
// flat tensor, and "<model>.<parameter>/step" -> step count, from optimizer.* (data parallel,
// keyed by state index) or from every optimizer_rank<r>.* (sharded, by the manifest's pieces).
std::map<std::string, at::Tensor> assembled_optimizer(const std::filesystem::path& dir) {
  std::map<std::string, at::Tensor> out;
  if (std::filesystem::exists(dir / "optimizer.safetensors")) {
    for (const auto& [key, t] : accelerate::checkpoint::SafetensorsFile::open(dir / "optimizer.safetensors").tensors())
      out[key] = t.reshape(-1);
    for (const auto& [index, state] : read_json(dir / "optimizer.json").at("state").items())
      out["state." + index + "/step"] = at::tensor({state.at("step").get<int64_t>()});
    return out;
  }
  for (int r = 0; std::filesystem::exists(dir / ("optimizer_rank" + std::to_string(r) + ".json")); ++r) {
    const auto stem = dir / ("optimizer_rank" + std::to_string(r));
    const auto values = read_json(stem.string() + ".json");
    const auto tensors = accelerate::checkpoint::SafetensorsFile::open(stem.string() + ".safetensors").tensors();
    for (const auto& piece : values.at("shards").at("pieces")) {
      const auto name = piece.at("model").get<std::string>() + "." + piece.at("parameter").get<std::string>();
      const auto index = std::to_string(piece.at("index").get<int64_t>());
      int64_t whole = 1;
      for (const auto d : piece.at("shape").get<std::vector<int64_t>>()) whole *= d;
      const auto offset = piece.at("offset").get<int64_t>(), numel = piece.at("numel").get<int64_t>();
      for (const auto& [key, t] : tensors) {
        const std::string prefix = "state." + index + ".";
        if (!key.starts_with(prefix)) continue;
        auto& target = out[name + "/" + key.substr(prefix.size())];
        if (!target.defined()) target = at::full({whole}, std::nan(""), t.options());
        target.narrow(0, offset, numel).copy_(t.reshape(-1));
      }
      out[name + "/step"] = at::tensor({values.at("state").at(index).at("step").get<int64_t>()});
    }
  }
  return out;
}

void expect_same_state(const std::filesystem::path& a, const std::filesystem::path& b) {
  const auto model_a = accelerate::checkpoint::SafetensorsFile::open(a / "model.safetensors").tensors();
  const auto model_b = accelerate::checkpoint::SafetensorsFile::open(b / "model.safetensors").tensors();
  ASSERT_EQ(model_a.size(), model_b.size());
  for (const auto& [key, t] : model_a) EXPECT_TRUE(torch::equal(t, model_b.at(key))) << key;
  const auto opt_a = assembled_optimizer(a), opt_b = assembled_optimizer(b);
  ASSERT_FALSE(opt_a.empty()) << a;
  ASSERT_EQ(opt_a.size(), opt_b.size()) << a << " vs " << b;
  for (const auto& [key, t] : opt_a) {
    ASSERT_TRUE(opt_b.count(key)) << key << " missing in " << b;
    EXPECT_FALSE(t.isnan().any().item<bool>()) << key << ": the slices do not cover the parameter";
    EXPECT_TRUE(torch::equal(t, opt_b.at(key))) << key;
  }
}

class Reshard : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Reshard, ResumesOnAnotherNumberOfProcessesAndBack) {
  const auto [backend, world] = GetParam();
  accelerate::testing::TempDir shared;
  const std::map<std::string, std::string> env{{"RESHARD_TEST_SHARED", shared.path().string()}};
  auto job = [&](const std::string& phase, int ranks) {
    return run_job("reshard", {.world_size = ranks, .env = env, .args = {phase, backend}});
  };
  auto first = job("first", 2);
  ASSERT_EQ(first.exit_code, 0) << first.logs();
  auto refused = job("refused", world);
  EXPECT_EQ(refused.exit_code, 0) << refused.logs();
  auto second = job("second", world);
  ASSERT_EQ(second.exit_code, 0) << second.logs();
  auto third = job("third", world);
  ASSERT_EQ(third.exit_code, 0) << third.logs();
  auto back = job("back", 2);
  ASSERT_EQ(back.exit_code, 0) << back.logs();

  // The asynchronous save holds the parameters of the moment it was called.
  const auto saved_model = accelerate::checkpoint::SafetensorsFile::open(shared / "saved" / "model.safetensors").tensors();
  std::vector<at::Tensor> parts;
  for (const char* key : {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"})
    parts.push_back(saved_model.at(key).reshape(-1).to(at::kDouble));
  EXPECT_TRUE(torch::equal(at::cat(parts), load_tensor(first.dir / "at_save_rank0.bin")));

  // The state is the saved one, whichever number of processes wrote it.
  expect_same_state(shared / "saved", shared / "resaved");
  expect_same_state(shared / "saved", shared / "back");
  EXPECT_EQ(read_json(shared.path() / "resaved" / "accelerate_state.json").at("world_size"), world);
  const auto position = read_json(shared.path() / "back" / "dl_state_dict.json");
  EXPECT_EQ(position.at("epoch"), 0);
  EXPECT_EQ(position.at("samples_consumed"), kFirstSteps * 2 * kBatch);

  // The epoch's samples, once each: those seen before the save and those seen after it.
  std::multiset<int64_t> seen;
  for (int r = 0; r < 2; ++r)
    for (const auto i : read_indices(shared / ("seen_first_rank" + std::to_string(r) + ".txt"))) seen.insert(i);
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(kFirstSteps * 2 * kBatch));
  for (int r = 0; r < world; ++r)
    for (const auto i : read_indices(shared / ("seen_second_rank" + std::to_string(r) + ".txt"))) seen.insert(i);
  for (int64_t i = 0; i < kSamples; ++i) EXPECT_EQ(seen.count(i), 1u) << "sample " << i;
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(kSamples));

  // The next epoch is a fresh run's on `world` processes.
  for (int r = 0; r < world; ++r) {
    accelerate::data::ShardSampler fresh({.dataset_size = kSamples, .batch_size = kBatch,
                                          .world_size = static_cast<std::size_t>(world),
                                          .rank = static_cast<std::size_t>(r), .shuffle = true, .seed = kShuffleSeed});
    const auto order = fresh.order(1);
    std::vector<int64_t> expected;
    for (std::size_t k = 0; k < fresh.batches_per_rank(); ++k)
      for (const auto i : fresh.batch(order, k)) expected.push_back(i);
    EXPECT_EQ(read_indices(shared / ("seen_next_epoch_rank" + std::to_string(r) + ".txt")), expected) << "rank " << r;
    // And the same samples as the run that resumed its own checkpoint, to the same parameters.
    EXPECT_EQ(read_indices(shared / ("seen_second_rank" + std::to_string(r) + ".txt")),
              read_indices(shared / ("seen_third_rank" + std::to_string(r) + ".txt")));
    const auto name = "end_rank" + std::to_string(r) + ".bin";
    EXPECT_LE((load_tensor(second.dir / name) - load_tensor(third.dir / name)).abs().max().item<double>(), 1e-6)
        << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(BackendsAndSizes, Reshard,
                         ::testing::Combine(::testing::Values("ddp", "zero1", "zero2"), ::testing::Values(1, 3, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_to_" + std::to_string(std::get<1>(info.param));
                         });

}  // namespace
