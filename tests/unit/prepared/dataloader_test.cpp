// Tests of include/accelerate/prepared/dataloader.hpp: what prepare() makes of datasets and
// ranges, epochs, and the saved position.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include <range/v3/view/enumerate.hpp>
#include <range/v3/view/take.hpp>

#include "../../support/models.hpp"

namespace {

TEST(PreparedDataLoader, DatasetWithoutGetBatchIsCollated) {
  // A LibTorch-style map dataset with only get(): samples are stacked.
  struct Squares : torch::data::datasets::Dataset<Squares> {
    torch::data::Example<> get(size_t i) override {
      return {torch::full({2}, double(i * i)), torch::tensor(int64_t(i))};
    }
    torch::optional<size_t> size() const override { return 5; }
  };
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto [loader] = acc.prepare(accelerate::DataLoader(Squares{}, {.batch_size = 2}));
  std::vector<int64_t> targets;
  for (auto& [x, y] : loader) {
    EXPECT_EQ(x.size(1), 2);
    for (int64_t i = 0; i < y.size(0); ++i) targets.push_back(y[i].item<int64_t>());
  }
  EXPECT_EQ(targets, (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(PreparedDataLoader, WorksWithRangeV3Views) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto [loader] = acc.prepare(accelerate::DataLoader(accelerate::testing::regression_data(40), {.batch_size = 4}));
  int seen = 0;
  for (auto&& [index, batch] : loader | ranges::views::enumerate | ranges::views::take(3)) {
    EXPECT_EQ(static_cast<int>(index), seen);
    EXPECT_EQ(batch.data.size(0), 4);
    ++seen;
  }
  EXPECT_EQ(seen, 3);
}

TEST(PreparedDataLoader, EpochsAdvanceAndShuffleDiffers) {
  accelerate::Accelerator<> acc{{.cpu = true, .seed = 11}};
  auto [loader] = acc.prepare(accelerate::DataLoader(accelerate::testing::regression_data(12), {.batch_size = 12, .shuffle = true}));
  std::vector<torch::Tensor> firsts;
  for (int epoch = 0; epoch < 2; ++epoch) {
    EXPECT_EQ(loader.epoch(), static_cast<std::size_t>(epoch));
    for (auto& [x, y] : loader) firsts.push_back(x.clone());
  }
  EXPECT_EQ(loader.epoch(), 2u);
  ASSERT_EQ(firsts.size(), 2u);
  EXPECT_FALSE(torch::equal(firsts[0], firsts[1]));
  loader.set_epoch(0);
  for (auto& [x, y] : loader) EXPECT_TRUE(torch::equal(x, firsts[0]));
}

TEST(PreparedDataLoader, StateResumesAtTheNextBatch) {
  auto data = accelerate::testing::regression_data(40);
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto [loader] = acc.prepare(accelerate::DataLoader(data, {.batch_size = 4, .shuffle = true, .seed = 3}));
  std::vector<torch::Tensor> straight;
  for (auto& [x, y] : loader) straight.push_back(x.clone());

  // Stop after 4 batches of epoch 0, save, and continue in a new loader.
  auto [first] = acc.prepare(accelerate::DataLoader(data, {.batch_size = 4, .shuffle = true, .seed = 3}));
  accelerate::StateDict saved;
  int k = 0;
  for ([[maybe_unused]] auto& batch : first) {
    if (++k == 4) {
      saved = first.state_dict();
      break;
    }
  }
  EXPECT_EQ(saved.value<std::size_t>("batches_consumed"), 4u);
  auto [second] = acc.prepare(accelerate::DataLoader(data, {.batch_size = 4, .shuffle = true, .seed = 99}));
  second.load_state_dict(saved);  // also restores the shuffle seed
  std::size_t index = 4;
  for (auto& [x, y] : second) EXPECT_TRUE(torch::equal(x, straight[index++]));
  EXPECT_EQ(index, straight.size());

  auto [skipping] = acc.prepare(accelerate::DataLoader(data, {.batch_size = 4, .shuffle = true, .seed = 3}));
  index = 7;
  for (auto& [x, y] : accelerate::skip_first_batches(skipping, 7)) EXPECT_TRUE(torch::equal(x, straight[index++]));
  EXPECT_EQ(index, straight.size());
}

TEST(PreparedDataLoader, StateOfAnotherWorldSizeResumesAfterTheSamplesAllRanksConsumed) {
  auto data = accelerate::testing::regression_data(40);
  accelerate::Accelerator<> acc{{.cpu = true}};
  const accelerate::DataLoaderOptions options{.batch_size = 4, .shuffle = true, .seed = 3};
  auto [reference] = acc.prepare(accelerate::DataLoader(data, options));
  std::vector<std::vector<torch::Tensor>> epochs(2);  // one process's batches: order positions 4k..4k+3
  for (auto& epoch : epochs)
    for (auto& [x, y] : reference) epoch.push_back(x.clone());

  // 2 processes consumed 3 batches each: positions 0..23 of epoch 0's order.
  for (const bool recorded : {true, false}) {  // states written before samples_consumed existed lack it
    auto [loader] = acc.prepare(accelerate::DataLoader(data, options));
    auto state = loader.state_dict();
    state.values["world_size"] = 2;
    state.values["batches_consumed"] = 3;
    if (recorded) state.values["samples_consumed"] = 24;
    else state.values.erase("samples_consumed");
    loader.load_state_dict(state);
    EXPECT_EQ(loader.size(), 4u) << "the rest of the epoch: 16 samples";
    std::size_t k = 6;
    for (auto& [x, y] : loader) EXPECT_TRUE(torch::equal(x, epochs[0][k++])) << "batch " << k;
    EXPECT_EQ(k, epochs[0].size());
    EXPECT_EQ(loader.size(), 10u) << "later epochs are whole";
    k = 0;
    for (auto& [x, y] : loader) EXPECT_TRUE(torch::equal(x, epochs[1][k++]));
    EXPECT_EQ(k, epochs[1].size());
  }
}

// A loop that calls set_epoch at the top of every epoch (Transformers' Trainer) resumes where
// the checkpoint was taken, whatever number of processes wrote it; naming another epoch starts
// that one from its beginning.
TEST(PreparedDataLoader, SetEpochOfTheResumedEpochKeepsTheResumedPosition) {
  auto data = accelerate::testing::regression_data(48);
  accelerate::Accelerator<> acc{{.cpu = true}};
  const accelerate::DataLoaderOptions options{.batch_size = 2, .shuffle = true, .seed = 3};
  auto [reference] = acc.prepare(accelerate::DataLoader(data, options));
  std::vector<torch::Tensor> epoch0, epoch1;
  for (auto& [x, y] : reference) epoch0.push_back(x.clone());
  for (auto& [x, y] : reference) epoch1.push_back(x.clone());

  // Saved by 2 processes after 6 steps each (24 samples), and by this one after 6 batches.
  for (const int saved_world : {2, 1}) {
    auto [loader] = acc.prepare(accelerate::DataLoader(data, options));
    auto state = loader.state_dict();
    state.values["world_size"] = saved_world;
    state.values["batches_consumed"] = 6;
    state.values["samples_consumed"] = 6 * 2 * saved_world;
    loader.load_state_dict(state);
    loader.set_epoch(0);
    std::size_t k = 6 * static_cast<std::size_t>(saved_world);
    for (auto& [x, y] : loader) EXPECT_TRUE(torch::equal(x, epoch0[k++])) << "saved by " << saved_world << ", batch " << k;
    EXPECT_EQ(k, epoch0.size()) << "saved by " << saved_world << ": the samples left, not the whole epoch";
    loader.set_epoch(1);
    k = 0;
    for (auto& [x, y] : loader) EXPECT_TRUE(torch::equal(x, epoch1[k++]));
    EXPECT_EQ(k, epoch1.size());

    auto [other] = acc.prepare(accelerate::DataLoader(data, options));
    other.load_state_dict(state);
    other.set_epoch(1);  // not the resumed epoch: all of epoch 1
    k = 0;
    for (auto& [x, y] : other) EXPECT_TRUE(torch::equal(x, epoch1[k++]));
    EXPECT_EQ(k, epoch1.size()) << "saved by " << saved_world;
  }
}

// A range resumed mid-epoch: its last, short accumulation window is divided by its own length.
TEST(PreparedDataLoader, AResumedRangeCountsTheBatchesLeft) {
  accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::Accumulate<4>> acc{{.cpu = true}};
  torch::nn::Linear net(torch::nn::LinearOptions(1, 1).bias(false));
  std::vector<torch::Tensor> batches(10, torch::ones({1, 1}));
  auto [model, loader] = acc.prepare(net, batches);
  std::size_t seen = 0;
  for (auto& x : accelerate::skip_first_batches(loader, 8)) {
    auto step = acc.accumulate(model);
    acc.backward(model(x).sum());  // each micro-step adds 1 / (window length)
    ++seen;
    EXPECT_EQ(acc.gradient_state().remaining(), 10 - 8 - seen + 1);
  }
  EXPECT_EQ(seen, 2u);
  EXPECT_DOUBLE_EQ(net->weight.grad().item<double>(), 1.0) << "the window of the 2 batches left is divided by 2";
}

TEST(PreparedDataLoader, AConstRangeIsPreparedAndOnlyRead) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  const std::vector<torch::Tensor> batches{torch::ones({2}), torch::zeros({2})};
  auto [loader] = acc.prepare(batches);
  std::size_t n = 0;
  for (auto& x : loader) EXPECT_TRUE(torch::equal(x, batches[n++]));
  EXPECT_EQ(n, 2u);
}

TEST(PreparedDataLoader, StateFromAnotherBatchingIsAnError) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto [loader] = acc.prepare(accelerate::DataLoader(accelerate::testing::regression_data(40), {.batch_size = 4}));
  auto state = loader.state_dict();
  state.values["batch_size"] = 8;
  state.values["batches_consumed"] = 2;
  try {
    loader.load_state_dict(state);
    FAIL() << "expected an error";
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("in batches of 8, this loader has 40 samples in batches of 4"),
              std::string::npos) << e.what();
  }
  EXPECT_EQ(loader.batches_consumed(), 0u) << "a refused state changes nothing";
}

// A dataset whose samples take uneven time to read (later ones often finish first on another
// worker) and which counts its reads; sample i is the row {i, i} with target i.
struct SlowDataset : torch::data::datasets::Dataset<SlowDataset> {
  std::shared_ptr<std::atomic<int>> reads = std::make_shared<std::atomic<int>>(0);
  int64_t samples = 30;
  int64_t broken = -1;  // get() of this index throws
  torch::data::Example<> get(size_t i) override {
    ++*reads;
    std::this_thread::sleep_for(std::chrono::microseconds(100 * ((5 * i) % 4)));
    if (static_cast<int64_t>(i) == broken) throw std::runtime_error("cannot decode this image");
    return {torch::full({2}, static_cast<double>(i)), torch::tensor(static_cast<int64_t>(i))};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(samples); }
};

std::vector<int64_t> targets_of(const torch::Tensor& y) {
  return {y.data_ptr<int64_t>(), y.data_ptr<int64_t>() + y.numel()};
}

int threads_of_this_process() {
  return static_cast<int>(std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                                        std::filesystem::directory_iterator{}));
}

TEST(PreparedDataLoaderWorkers, YieldTheBatchesOfZeroWorkersShuffledOverEpochs) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto epochs_with = [&](std::size_t workers) {
    auto [loader] = acc.prepare(accelerate::DataLoader(
        SlowDataset{}, {.batch_size = 4, .shuffle = true, .seed = 8, .num_workers = workers, .prefetch_factor = 3}));
    std::vector<std::vector<int64_t>> batches;
    for (int epoch = 0; epoch < 2; ++epoch)
      for (auto& [x, y] : loader) {
        EXPECT_TRUE(torch::equal(x.select(1, 0).to(torch::kLong), y));
        batches.push_back(targets_of(y));
      }
    return batches;
  };
  const auto reference = epochs_with(0);
  ASSERT_EQ(reference.size(), 16u);  // 8 batches a epoch, the last of 2 samples
  for (const std::size_t workers : {1u, 2u, 5u}) EXPECT_EQ(epochs_with(workers), reference) << workers << " workers";

  // get_batch datasets (a TensorDataset) too.
  auto data = accelerate::testing::regression_data(37);
  auto tensors_with = [&](std::size_t workers) {
    auto [loader] = acc.prepare(accelerate::DataLoader(data, {.batch_size = 5, .shuffle = true, .seed = 2, .num_workers = workers}));
    std::vector<torch::Tensor> xs;
    for (auto& batch : loader) xs.push_back(batch.data);
    return torch::cat(xs);
  };
  EXPECT_TRUE(torch::equal(tensors_with(3), tensors_with(0)));
}

TEST(PreparedDataLoaderWorkers, ResumeWhereZeroWorkersWould) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  const accelerate::DataLoaderOptions options{.batch_size = 3, .shuffle = true, .seed = 4, .num_workers = 2};
  auto [straight] = acc.prepare(accelerate::DataLoader(SlowDataset{}, options));
  std::vector<std::vector<int64_t>> all;
  for (auto& [x, y] : straight) all.push_back(targets_of(y));

  auto [first] = acc.prepare(accelerate::DataLoader(SlowDataset{}, options));
  accelerate::StateDict saved;
  for ([[maybe_unused]] auto& batch : first)
    if (first.batches_consumed() == 4) {
      saved = first.state_dict();
      break;  // the workers were reading ahead: their batches are not "consumed"
    }
  ASSERT_EQ(saved.value<std::size_t>("batches_consumed"), 4u);
  auto options_3 = options;
  options_3.num_workers = 3;
  auto [resumed] = acc.prepare(accelerate::DataLoader(SlowDataset{}, options_3));
  resumed.load_state_dict(saved);
  std::size_t k = 4;
  for (auto& [x, y] : resumed) EXPECT_EQ(targets_of(y), all[k++]);
  EXPECT_EQ(k, all.size());
}

TEST(PreparedDataLoaderWorkers, ADatasetErrorNamesTheSampleAndTheOriginalMessage) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  SlowDataset broken;
  broken.broken = 13;
  auto [loader] = acc.prepare(accelerate::DataLoader(broken, {.batch_size = 4, .num_workers = 2}));
  std::vector<int64_t> seen;
  try {
    for (auto& [x, y] : loader)
      for (auto t : targets_of(y)) seen.push_back(t);
    FAIL() << "expected an error";
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("reading sample 13 failed: cannot decode this image"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})) << "every batch before it arrived";

  // A get_batch dataset's failure names the batch's samples.
  struct BrokenBatches {
    std::size_t size() const { return 8; }
    torch::Tensor get_batch(c10::ArrayRef<int64_t> indices) {
      if (indices.front() == 4) throw std::runtime_error("truncated shard");
      return torch::tensor(indices.vec());
    }
  };
  auto [batches] = acc.prepare(accelerate::DataLoader(BrokenBatches{}, {.batch_size = 2, .num_workers = 1}));
  try {
    for ([[maybe_unused]] auto& batch : batches) {}
    FAIL() << "expected an error";
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("reading the batch of samples [4, 5] failed: truncated shard"),
              std::string::npos) << e.what();
  }
}

TEST(PreparedDataLoaderWorkers, LeavingTheLoopStopsAndJoinsTheWorkers) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  SlowDataset dataset;
  dataset.samples = 4000;
  const auto reads = dataset.reads;
  const int threads_before = threads_of_this_process();
  auto [loader] = acc.prepare(accelerate::DataLoader(dataset, {.batch_size = 2, .num_workers = 3, .prefetch_factor = 2}));
  for ([[maybe_unused]] auto& batch : loader) {
    EXPECT_GT(threads_of_this_process(), threads_before) << "the workers run while the loop does";
    if (loader.batches_consumed() == 2) break;
  }
  EXPECT_EQ(threads_of_this_process(), threads_before) << "every worker joined at the break";
  const int read_at_break = reads->load();
  EXPECT_LE(read_at_break, 2 * (2 + 3 * 2 + 3)) << "consumed + window + one batch in flight per worker";
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(reads->load(), read_at_break) << "nothing reads after the loop";

  // An exception out of the loop body joins them too; a new loop starts the epoch again.
  try {
    for ([[maybe_unused]] auto& batch : loader) throw std::runtime_error("the training step failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(threads_of_this_process(), threads_before);
  EXPECT_EQ(loader.batches_consumed(), 1u);
  for (auto& [x, y] : loader) {
    EXPECT_EQ(targets_of(y), (std::vector<int64_t>{0, 1})) << "a new loop starts the epoch again";
    break;
  }
  EXPECT_EQ(threads_of_this_process(), threads_before);
}

TEST(PreparedDataLoaderWorkers, ZeroWorkersStartNoThread) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  const int threads_before = threads_of_this_process();
  auto [loader] = acc.prepare(accelerate::DataLoader(SlowDataset{}, {.batch_size = 2}));
  for ([[maybe_unused]] auto& batch : loader) EXPECT_EQ(threads_of_this_process(), threads_before);
}

TEST(PreparedDataLoaderSplitBatches, OneProcessTakesTheWholeGlobalBatch) {
  accelerate::Accelerator<> acc{{.cpu = true, .data = {.split_batches = true}}};
  auto [loader] = acc.prepare(accelerate::DataLoader(SlowDataset{}, {.batch_size = 4}));
  EXPECT_EQ(loader.size(), 8u);
  for (auto& [x, y] : loader) {
    EXPECT_EQ(targets_of(y).front() % 4, 0);
    break;
  }
  // A state saved by 2 processes splitting the same global batch of 4 (slices of 2) resumes;
  // one saved without splitting is refused, naming the option.
  auto state = loader.state_dict();
  EXPECT_TRUE(state.value<bool>("split_batches"));
  state.values["world_size"] = 2;
  state.values["batch_size"] = 2;
  state.values["batches_consumed"] = 3;
  state.values["samples_consumed"] = 12;
  loader.load_state_dict(state);
  for (auto& [x, y] : loader) {
    EXPECT_EQ(targets_of(y), (std::vector<int64_t>{12, 13, 14, 15}));
    break;
  }
  state.values["split_batches"] = false;
  state.values["batch_size"] = 4;
  state.values["world_size"] = 1;
  try {
    loader.load_state_dict(state);
    FAIL() << "expected an error";
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("split_batches = false, this loader has split_batches = true"),
              std::string::npos) << e.what();
  }
}

}  // namespace
