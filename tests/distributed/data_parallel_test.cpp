// Data parallel training over Gloo with real processes: equivalence with one process at the
// global batch, gradient buckets, sharded data and collectives.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "../support/prelude.hpp"

namespace {

using namespace accelerate::testing::prelude;

constexpr int64_t kPerRankBatch = 8;
constexpr int kSteps = 10;

// 10 SGD steps with momentum on a regression task; the dataset holds exactly the samples the
// 10 global batches need, shuffled with a fixed seed.
template <class Acc>
torch::Tensor train_steps(Acc& acc, int64_t batch_size, std::size_t dataset_size) {
  torch::manual_seed(5);  // every rank's init differs only if prepare() forgot to broadcast
  if (acc.process_index() > 0) torch::manual_seed(1000 + acc.process_index());
  TinyNet net(8, 32, 4);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto [model, opt, loader] = acc.prepare(
      net, sgd,
      accelerate::DataLoader(accelerate::testing::regression_data(static_cast<int64_t>(dataset_size)),
                             {.batch_size = static_cast<std::size_t>(batch_size), .shuffle = true, .seed = 17}));
  int steps = 0;
  for (auto& [x, y] : loader) {
    opt.zero_grad();
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    ++steps;
  }
  EXPECT_EQ(steps, kSteps);
  return flat_parameters(*net);
}

ACCELERATE_WORKER(train_gloo) {
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 60s}}};
  const auto world = acc.num_processes();
  auto params = train_steps(acc, kPerRankBatch, static_cast<std::size_t>(kSteps * kPerRankBatch * world));
  save_tensor(job_dir() / ("params_rank" + std::to_string(acc.process_index()) + ".bin"), params);
  const auto stats = acc.stats();
  return stats.grad_sync_rounds == kSteps && stats.gradient_allreduce.calls >= kSteps ? 0 : 3;
}

class DataParallel : public ::testing::TestWithParam<int> {};

TEST_P(DataParallel, EqualsOneProcessWithTheGlobalBatch) {
  const int world = GetParam();
  auto job = run_job("train_gloo", {.world_size = world});
  ASSERT_EQ(job.exit_code, 0) << job.logs();

  accelerate::Accelerator<> single{{.cpu = true}};
  torch::manual_seed(5);
  const auto reference = train_steps(single, kPerRankBatch * world, static_cast<std::size_t>(kSteps * kPerRankBatch * world));
  for (int r = 0; r < world; ++r) {
    const auto params = load_tensor(job.dir / ("params_rank" + std::to_string(r) + ".bin"));
    EXPECT_LE((params - reference.to(torch::kDouble)).abs().max().item<double>(), 1e-6) << "rank " << r;
  }
}
INSTANTIATE_TEST_SUITE_P(Ranks, DataParallel, ::testing::Values(2, 3));

ACCELERATE_WORKER(buckets_average) {
  // Small buckets: several all-reduces per backward, launched from hooks during backward.
  accelerate::Accelerator<accelerate::Gloo> acc{
      {.process_group = {.timeout = 60s}, .ddp = {.bucket_cap_bytes = 1024, .first_bucket_cap_bytes = 16}}};
  TinyNet net(8, 64, 4);
  auto [model] = acc.prepare(net);
  auto* reducer = model.model_sync().reducer();
  if (reducer == nullptr || reducer->bucket_count() < 3) return 4;
  torch::manual_seed(100 + acc.process_index());  // different data on every rank
  const auto x = torch::randn({16, 8});
  {
    auto local_only = acc.no_sync(model);
    acc.backward(model(x).pow(2).mean());
  }
  const auto local = flat_gradients(*net).clone();
  for (auto& p : net->parameters()) p.mutable_grad().reset();
  if (acc.stats().gradient_allreduce.calls != 0) return 5;  // no_sync communicated nothing

  acc.backward(model(x).pow(2).mean());
  const auto synced = flat_gradients(*net);
  const auto expected = acc.gather(local.unsqueeze(0)).mean(0);
  if ((synced - expected).abs().max().item<double>() > 1e-6) return 6;
  const auto stats = acc.stats();
  if (stats.grad_sync_rounds != 1 || stats.gradient_allreduce.calls != reducer->bucket_count()) return 7;
  // Every bucket but the last went out while backward was still producing gradients.
  if (reducer->overlapped_launches() < reducer->bucket_count() - 1) return 8;
  save_tensor(job_dir() / ("grad_rank" + std::to_string(acc.process_index()) + ".bin"), synced);
  return 0;
}

TEST(DataParallelGradients, AreTheMeanOfLocalGradientsAcrossBuckets) {
  auto job = run_job("buckets_average", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  EXPECT_TRUE(torch::equal(load_tensor(job.dir / "grad_rank0.bin"), load_tensor(job.dir / "grad_rank1.bin")));
}

// fc2 is used only when the flag says so: with it unused, its bucket can never complete.
struct BranchyImpl : torch::nn::Module {
  BranchyImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 8))), fc2(register_module("fc2", torch::nn::Linear(8, 8))) {}
  torch::Tensor forward(const torch::Tensor& x, bool use_fc2) { return use_fc2 ? fc2(fc1(x)) : fc1(x); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Branchy);

ACCELERATE_WORKER(unused_parameters) {
  const bool tolerate = std::getenv("ACCELERATE_TEST_ARGS") && std::string(std::getenv("ACCELERATE_TEST_ARGS")).find("find") != std::string::npos;
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 60s}, .ddp = {.find_unused_parameters = tolerate}}};
  Branchy net;
  auto [model] = acc.prepare(net);
  acc.backward(model(torch::randn({4, 8}), true).sum());  // every parameter used
  for (auto& p : net->parameters()) p.mutable_grad().reset();
  try {
    acc.backward(model(torch::randn({4, 8}), false).sum());  // fc2 unused
  } catch (const accelerate::Error& e) {
    std::cerr << e.what() << std::endl;
    return tolerate ? 3 : 0;  // without find_unused_parameters the error is the expected outcome
  }
  if (!tolerate) return 4;
  // Tolerated, as PyTorch DDP: fc1 is averaged; fc2, unused on every rank, keeps its gradient
  // as it was (undefined), so an optimizer's momentum and weight decay leave it alone.
  return net->fc1->weight.grad().defined() && !net->fc2->weight.grad().defined() ? 0 : 5;
}

TEST(DataParallelGradients, UnusedParametersAreNamedOrToleratedOnRequest) {
  auto strict = run_job("unused_parameters", {.world_size = 2});
  EXPECT_EQ(strict.exit_code, 0) << strict.logs();
  EXPECT_NE(strict.log(0).find("2 parameter(s) received no gradient in this backward pass"), std::string::npos)
      << strict.logs();
  EXPECT_NE(strict.log(0).find("fc2.weight fc2.bias"), std::string::npos) << strict.logs();
  EXPECT_NE(strict.log(0).find("find_unused_parameters = true"), std::string::npos) << strict.logs();
  auto tolerant = run_job("unused_parameters", {.world_size = 2, .args = {"find"}});
  EXPECT_EQ(tolerant.exit_code, 0) << tolerant.logs();
}

// fc2 unused on every rank for 5 SGD steps with momentum and weight decay: it must not move.
// fc2 used on rank 1 only: both ranks get rank 1's gradient divided by 2 (rank 0 adds zeros).
// And the unused fc2 sits in the first buckets to launch: they must not hold the others back.
ACCELERATE_WORKER(unused_parameters_like_ddp) {
  accelerate::Accelerator<accelerate::Gloo> acc{
      {.process_group = {.timeout = 60s},
       .ddp = {.bucket_cap_bytes = 1, .first_bucket_cap_bytes = 1, .find_unused_parameters = true}}};
  const int rank = acc.process_index();
  torch::manual_seed(0);
  Branchy net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.1));
  auto [model, opt] = acc.prepare(net, sgd);
  const auto fc2_before = net->fc2->weight.clone();
  torch::manual_seed(10 + rank);
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad();
    acc.backward(model(torch::randn({4, 8}), false).sum());
    opt.step();
  }
  const bool fc2_still = torch::equal(fc2_before, net->fc2->weight);
  const auto overlapped = model.model_sync().reducer()->overlapped_launches();
  opt.zero_grad();
  const auto x = torch::randn({4, 8});
  acc.backward(model(x, rank == 1).sum());
  save_tensor(job_dir() / ("fc2_grad_rank" + std::to_string(rank) + ".bin"),
              net->fc2->weight.grad().defined() ? net->fc2->weight.grad() : torch::full({1}, -1.0));
  if (rank == 1) {
    // Rank 1's own gradient of fc2, computed locally with the same input.
    Branchy copy;
    {
      torch::NoGradGuard no_grad;
      auto from = net->parameters();
      auto to = copy->parameters();
      for (std::size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
    }
    copy->forward(x, true).sum().backward();
    save_tensor(job_dir() / "fc2_local_grad.bin", copy->fc2->weight.grad());
  }
  std::cerr << "rank " << rank << ": fc2 unchanged " << fc2_still << ", overlapped launches " << overlapped << std::endl;
  return fc2_still && overlapped > 0 ? 0 : 3;
}

TEST(DataParallelGradients, UnusedParametersFollowPyTorchDdp) {
  auto job = run_job("unused_parameters_like_ddp", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  const auto local = load_tensor(job.dir / "fc2_local_grad.bin");
  for (const int rank : {0, 1}) {
    const auto grad = load_tensor(job.dir / ("fc2_grad_rank" + std::to_string(rank) + ".bin"));
    ASSERT_EQ(grad.numel(), local.numel()) << "rank " << rank << " got no fc2 gradient";
    EXPECT_TRUE(torch::allclose(grad, local / 2, 1e-6, 1e-7)) << "rank " << rank;
  }
}

// BatchNorm statistics: with broadcast_buffers (the default) rank 0's buffers reach every rank
// before each forward, as in PyTorch DDP, so after an eval forward they are equal everywhere;
// without it each rank's drift from its own data.
ACCELERATE_WORKER(broadcast_buffers) {
  const bool broadcast = !(std::getenv("ACCELERATE_TEST_ARGS") && std::string(std::getenv("ACCELERATE_TEST_ARGS")).find("off") != std::string::npos);
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 60s}, .ddp = {.broadcast_buffers = broadcast}}};
  const int rank = acc.process_index();
  torch::manual_seed(0);
  accelerate::testing::Wide net;
  torch::optim::SGD sgd(net->parameters(), 0.01);
  auto [model, opt] = acc.prepare(net, sgd);
  torch::manual_seed(100 + rank);  // different data on each rank
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    acc.backward(model(torch::randn({16, 64}) * (1 + rank)).sum());
    opt.step();
  }
  model->eval();
  (void)model(torch::randn({4, 64}));
  save_tensor(job_dir() / ("running_mean_rank" + std::to_string(rank) + ".bin"), net->norm->running_mean);
  return 0;
}

TEST(DataParallelBuffers, AreRankZerosBeforeEveryForwardAsInDdp) {
  auto on = run_job("broadcast_buffers", {.world_size = 2});
  auto off = run_job("broadcast_buffers", {.world_size = 2, .args = {"off"}});
  ASSERT_EQ(on.exit_code, 0) << on.logs();
  ASSERT_EQ(off.exit_code, 0) << off.logs();
  auto mean = [](const accelerate::testing::JobResult& job, int rank) {
    return load_tensor(job.dir / ("running_mean_rank" + std::to_string(rank) + ".bin"));
  };
  EXPECT_TRUE(torch::equal(mean(on, 0), mean(on, 1))) << "statistics diverged between ranks";
  EXPECT_FALSE(torch::equal(mean(off, 0), mean(off, 1))) << "without the broadcast each rank keeps its own";
}

// A map-style dataset is read only at this rank's indices: every sample read is one this rank
// yields, once, and over the ranks every index of the epoch is read exactly once (a counting
// dataset; no rank touches another's samples, not even to look at shapes).
struct CountingDataset : torch::data::datasets::Dataset<CountingDataset> {
  std::shared_ptr<std::vector<int64_t>> reads = std::make_shared<std::vector<int64_t>>();
  torch::data::Example<> get(size_t i) override {
    reads->push_back(static_cast<int64_t>(i));
    return {torch::full({2}, static_cast<double>(i)), torch::tensor(static_cast<int64_t>(i))};
  }
  torch::optional<size_t> size() const override { return 24; }
};

ACCELERATE_WORKER(per_rank_reads) {
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 60s}}};
  CountingDataset dataset;
  const auto reads = dataset.reads;
  auto [loader] = acc.prepare(accelerate::DataLoader(dataset, {.batch_size = 2, .shuffle = true, .seed = 3}));
  std::vector<int64_t> yielded;
  for (auto& [x, y] : loader)
    for (int64_t i = 0; i < y.size(0); ++i) yielded.push_back(y[i].item<int64_t>());
  auto sorted_reads = *reads, sorted_yielded = yielded;
  std::sort(sorted_reads.begin(), sorted_reads.end());
  std::sort(sorted_yielded.begin(), sorted_yielded.end());
  if (sorted_reads != sorted_yielded) {
    std::cerr << "rank " << acc.process_index() << " read " << reads->size() << " samples, yielded " << yielded.size() << "\n";
    return 3;
  }
  const auto everyone = acc.gather(torch::tensor(*reads));  // 24 over the ranks: no padding
  const auto all = std::get<0>(everyone.sort());
  return torch::equal(all, torch::arange(24)) ? 0 : 4;
}

TEST_P(DataParallel, MapStyleDatasetsAreReadOnlyAtThisRanksIndices) {
  auto job = run_job("per_rank_reads", {.world_size = GetParam()});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
}

}  // namespace

namespace {

// Accelerate's split_batches table: range(24) in global batches of 2W, each rank gets its
// 2-row slice (2 ranks: rank 0 [0,1],[4,5],...; rank 1 [2,3],[6,7],...), from a map-style
// dataset and from a range of global batches alike; a scheduler steps once per optimizer step.
ACCELERATE_WORKER(split_batches) {
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 60s}, .data = {.split_batches = true}}};
  const int64_t world = acc.num_processes(), rank = acc.process_index(), global = 2 * world;
  auto expected = [&](int64_t k) { return torch::arange(k * global + 2 * rank, k * global + 2 * rank + 2); };
  auto fail = [&](const std::string& what) {
    std::cerr << "rank " << rank << ": " << what << "\n";
    return 3;
  };

  const auto numbers = torch::arange(24);
  auto [loader] = acc.prepare(accelerate::DataLoader(accelerate::data::TensorDataset(numbers, numbers),
                                                     {.batch_size = static_cast<std::size_t>(global)}));
  if (loader.size() != static_cast<std::size_t>(24 / global)) return fail("map-style loader size " + std::to_string(loader.size()));
  int64_t k = 0;
  for (auto& batch : loader)
    if (!torch::equal(batch.target, expected(k++))) return fail("map-style batch " + std::to_string(k - 1));

  std::vector<torch::Tensor> batches;  // each element is a global batch
  for (int64_t b = 0; b < 24 / global; ++b) batches.push_back(torch::arange(b * global, (b + 1) * global));
  auto [range] = acc.prepare(batches);
  if (range.size() != batches.size()) return fail("range loader size " + std::to_string(range.size()));
  k = 0;
  for (auto& batch : range)
    if (!torch::equal(batch, expected(k++))) return fail("range batch " + std::to_string(k - 1));

  torch::nn::Linear net(1, 1);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(1.0));
  torch::optim::StepLR halve(sgd, /*step_size=*/10, /*gamma=*/0.5);
  auto [model, opt, sched] = acc.prepare(net, sgd, halve);
  acc.backward(model(torch::ones({2, 1})).sum());
  opt.step();
  sched.step();
  // (Without split_batches it would have stepped world_size times.)
  const auto stepped = sched.state_dict().value<int64_t>("step_count");
  if (stepped != 1) return fail("the scheduler stepped " + std::to_string(stepped) + " times for one optimizer step");

  // A global batch that does not divide between the processes is refused, naming it.
  try {
    [[maybe_unused]] auto refused = acc.prepare(accelerate::DataLoader(
        accelerate::data::TensorDataset(numbers, numbers), {.batch_size = static_cast<std::size_t>(global + 1)}));
    return fail("an indivisible batch size was accepted");
  } catch (const accelerate::Error& e) {
    if (std::string(e.what()).find("must divide between the " + std::to_string(world) + " processes") == std::string::npos)
      return fail(e.what());
  }
  return 0;
}

TEST_P(DataParallel, SplitBatchesGiveEachRankItsSliceOfTheGlobalBatch) {
  auto job = run_job("split_batches", {.world_size = GetParam()});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
}

}  // namespace

namespace {

// A range of dict batches that counts how often its elements are read; element k has 1 + k % 3
// rows (rounds of uneven shapes), ids k*10.., features k, and a name.
struct CountingBatches {
  using Batch = std::map<std::string, torch::Tensor>;
  std::shared_ptr<int> reads = std::make_shared<int>(0);
  int64_t count = 12;
  int64_t rows_per_element = 0;  // 0: 1 + k % 3; else all elements have this many rows

  int64_t rows(int64_t k) const { return rows_per_element ? rows_per_element : 1 + k % 3; }
  Batch element(int64_t k) const {
    return {{"ids", torch::arange(rows(k)) + 10 * k}, {"x", torch::full({rows(k), 3}, static_cast<double>(k))}};
  }
  struct iterator {
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    const CountingBatches* range = nullptr;
    int64_t k = 0;
    Batch operator*() const {
      ++*range->reads;
      return range->element(k);
    }
    iterator& operator++() {
      ++k;
      return *this;
    }
    void operator++(int) { ++k; }
    bool operator==(const iterator& other) const { return k == other.k; }
  };
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, count}; }
  std::size_t size() const { return static_cast<std::size_t>(count); }
};

bool same_batch(const CountingBatches::Batch& a, const CountingBatches::Batch& b) {
  return a.size() == b.size() && torch::equal(a.at("ids"), b.at("ids")) && torch::equal(a.at("x"), b.at("x"));
}

// dispatch_batches: rank 0 alone iterates the range; each rank gets the batches it would have
// read itself (element k*W + r; with split_batches its slice of element k), also after a resume.
ACCELERATE_WORKER(dispatch_batches) {
  const char* mode = std::getenv("ACCELERATE_TEST_ARGS");  // "split\n" or "whole\n"
  const bool split = mode != nullptr && std::string(mode).rfind("split", 0) == 0;
  accelerate::Accelerator<accelerate::Gloo> acc{
      {.process_group = {.timeout = 60s}, .data = {.split_batches = split, .dispatch_batches = true}}};
  const auto world = static_cast<int64_t>(acc.num_processes()), rank = static_cast<int64_t>(acc.process_index());
  auto fail = [&](const std::string& what) {
    std::cerr << "rank " << rank << ": " << what << "\n";
    return 3;
  };
  CountingBatches range;
  if (split) range.rows_per_element = 2 * world;
  const auto reads = range.reads;
  auto expected = [&](int64_t k) {
    if (!split) return range.element(k * world + rank);
    auto whole = range.element(k);
    return CountingBatches::Batch{{"ids", whole.at("ids").narrow(0, 2 * rank, 2)}, {"x", whole.at("x").narrow(0, 2 * rank, 2)}};
  };
  auto [loader] = acc.prepare(range);
  const int64_t batches = split ? range.count : range.count / world;
  if (static_cast<int64_t>(loader.size()) != batches) return fail("size " + std::to_string(loader.size()));
  int64_t k = 0;
  accelerate::StateDict saved;
  for (auto& batch : loader) {
    if (!same_batch(batch, expected(k))) return fail("batch " + std::to_string(k) + " differs");
    if (++k == 2) saved = loader.state_dict();
  }
  if (k != batches) return fail("yielded " + std::to_string(k) + " batches");
  const int read_by_rank_0 = static_cast<int>((split ? range.count : (range.count / world) * world));
  if (*reads != (rank == 0 ? read_by_rank_0 : 0))
    return fail("read " + std::to_string(*reads) + " elements of the range");

  // A resumed loop starts at batch 2 on every rank, rank 0 skipping rounds without sending them.
  loader.load_state_dict(saved);
  k = 2;
  for (auto& batch : loader)
    if (!same_batch(batch, expected(k++))) return fail("resumed batch " + std::to_string(k - 1) + " differs");
  if (k != batches) return fail("resumed run yielded " + std::to_string(k - 2) + " batches");
  const auto sent = acc.stats().broadcast.calls;
  if (sent == 0) return fail("no broadcast was counted");
  return 0;
}

TEST_P(DataParallel, DispatchBatchesReadTheRangeOnRankZeroOnly) {
  for (const std::string mode : {"whole", "split"}) {
    auto job = run_job("dispatch_batches", {.world_size = GetParam(), .args = {mode}});
    ASSERT_EQ(job.exit_code, 0) << mode << "\n" << job.logs();
  }
}

}  // namespace

namespace {

// join_uneven_inputs: rank r has 2 + 2r batches of its own (3 ranks: 2, 4 and 6), so ranks run
// out several steps apart. Each step's gradient is the mean over the ranks still training; at
// the end every rank holds the last rank's model. The parent replays that in one process.
torch::Tensor uneven_batch(int64_t rank, int64_t k, bool target) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(1000 * rank + 2 * k + (target ? 1 : 0)));
  return target ? at::randn({4, 4}, gen) : at::randn({4, 8}, gen);
}
int64_t uneven_batches(int64_t rank) { return 2 + 2 * rank; }

ACCELERATE_WORKER(join_uneven) {
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 60s}}};
  const int64_t rank = acc.process_index();
  torch::manual_seed(5);
  TinyNet net(8, 16, 4);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto [model, opt] = acc.prepare(net, sgd);
  {
    auto join = acc.join_uneven_inputs(model);
    for (int64_t k = 0; k < uneven_batches(rank); ++k) {
      opt.zero_grad();
      acc.backward(torch::mse_loss(model(uneven_batch(rank, k, false)), uneven_batch(rank, k, true)));
      opt.step();
    }
  }
  save_tensor(job_dir() / ("params_rank" + std::to_string(rank) + ".bin"), flat_parameters(*net));

  // After the scope the model trains as before: one more step on every rank stays in step.
  opt.zero_grad();
  acc.backward(torch::mse_loss(model(uneven_batch(rank, 99, false)), uneven_batch(rank, 99, true)));
  opt.step();
  const auto params = flat_parameters(*net);
  const auto everyone = acc.gather(params.unsqueeze(0));
  for (int64_t r = 1; r < everyone.size(0); ++r)
    if (!torch::equal(everyone[r], everyone[0])) {
      std::cerr << "rank " << r << "'s model differs after a step outside the join scope\n";
      return 3;
    }
  return 0;
}

TEST_P(DataParallel, JoinUnevenInputsAveragesOverTheRanksStillTrainingAndEndsTogether) {
  const int world = GetParam();
  auto job = run_job("join_uneven", {.world_size = world});
  ASSERT_EQ(job.exit_code, 0) << job.logs();

  // The same steps in one process: step t averages the gradients of the ranks with a batch t.
  torch::manual_seed(5);
  TinyNet net(8, 16, 4);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int64_t k = 0; k < uneven_batches(world - 1); ++k) {
    std::vector<torch::Tensor> sums;
    int64_t training = 0;
    for (int64_t r = 0; r < world; ++r) {
      if (k >= uneven_batches(r)) continue;
      ++training;
      sgd.zero_grad();
      torch::mse_loss(net(uneven_batch(r, k, false)), uneven_batch(r, k, true)).backward();
      const auto params = net->parameters();
      if (sums.empty()) for (const auto& p : params) sums.push_back(p.grad().clone());
      else for (std::size_t i = 0; i < params.size(); ++i) sums[i] += params[i].grad();
    }
    const auto params = net->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = sums[i] / static_cast<double>(training);
    sgd.step();
  }
  const auto reference = flat_parameters(*net).to(torch::kDouble);
  for (int r = 0; r < world; ++r) {
    const auto params = load_tensor(job.dir / ("params_rank" + std::to_string(r) + ".bin"));
    EXPECT_LE((params - reference).abs().max().item<double>(), 1e-6) << "rank " << r;
  }
}

// A prepared loader with even_batches = false over 2W*2+1 samples in batches of 2: rank 0 gets
// one batch more than the others; with accumulation over 2 micro-steps and a model with
// buffers (broadcast before each forward), the ranks end together with the same model.
struct WithBufferImpl : torch::nn::Module {
  WithBufferImpl() : fc(register_module("fc", torch::nn::Linear(8, 4))) {
    steps = register_buffer("steps", torch::zeros({1}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    steps += 1;
    return fc(x);
  }
  torch::nn::Linear fc;
  torch::Tensor steps;
};
TORCH_MODULE(WithBuffer);

ACCELERATE_WORKER(join_loader) {
  accelerate::Accelerator<accelerate::Gloo, accelerate::Fp32, accelerate::AccumulateDynamic> acc{
      {.accumulation = {.num_steps = 2}, .process_group = {.timeout = 60s}, .data = {.even_batches = false}}};
  const int64_t world = acc.num_processes(), rank = acc.process_index();
  torch::manual_seed(3);
  WithBuffer net;
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(0.01));
  auto [model, opt, loader] = acc.prepare(
      net, adamw, accelerate::DataLoader(accelerate::testing::regression_data(4 * world + 1), {.batch_size = 2}));
  const std::size_t expected = rank == 0 ? 3 : 2;
  if (loader.size() != expected) {
    std::cerr << "rank " << rank << " has " << loader.size() << " batches\n";
    return 4;
  }
  {
    auto join = acc.join_uneven_inputs(model);
    for (auto& [x, y] : loader) {
      auto step = acc.accumulate(model);
      acc.backward(torch::mse_loss(model(x), y));
      opt.step();
      opt.zero_grad();
    }
  }
  const auto state = torch::cat({flat_parameters(*net), net->steps}).unsqueeze(0);
  const auto everyone = acc.gather(state);
  for (int64_t r = 1; r < everyone.size(0); ++r)
    if (!torch::equal(everyone[r], everyone[0])) {
      std::cerr << "rank " << r << " ends with another model than rank 0\n";
      return 3;
    }
  return everyone[0][-1].item<double>() == 3.0 ? 0 : 5;  // rank 0's three forwards
}

TEST_P(DataParallel, JoinUnevenInputsWithAPreparedLoaderAccumulationAndBuffers) {
  auto job = run_job("join_loader", {.world_size = GetParam()});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
}

}  // namespace
