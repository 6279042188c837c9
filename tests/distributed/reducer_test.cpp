// Tests of include/accelerate/distributed/reducer.hpp (and the reduction it picks), with real
// processes over Gloo: gradients as bucket views, buckets rebuilt in arrival order, sums in
// rank order, compressed buckets (fp16, bf16, PowerSGD), the saved layout, and the
// communication time reported by stats().
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "../support/prelude.hpp"
#include "../support/temp_dir.hpp"

namespace {

using namespace accelerate::testing::prelude;

std::string test_args() {
  const char* args = std::getenv("ACCELERATE_TEST_ARGS");
  return args ? args : "";
}

// Registered head first, stem last, but run stem -> body -> head: reverse registration order
// (the initial bucket order) puts the stem, whose gradients come last, in the first bucket.
struct ReversedImpl : torch::nn::Module {
  ReversedImpl()
      : head(register_module("head", torch::nn::Linear(32, 4))),
        body(register_module("body", torch::nn::Linear(16, 32))),
        stem(register_module("stem", torch::nn::Linear(8, 16))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head(torch::relu(body(torch::relu(stem(x))))); }
  torch::nn::Linear head, body, stem;
};
TORCH_MODULE(Reversed);

struct Variant {
  const char* name;
  bool views;
  bool arrival;
  bool set_to_none;
  bool ring = false;  // DdpOptions::sum_in_rank_order off: Gloo's ring all-reduce
};
constexpr Variant kVariants[] = {
    {"copies", false, false, true},  // the reducer as it was: the reference
    {"views", true, false, true},
    {"views_arrival", true, true, true},
    {"views_arrival_zeroed", true, true, false},  // zero_grad(false) keeps the views
    {"copies_arrival", false, true, true},
    {"ring_views_arrival", true, true, true, true},
};

// 20 optimizer steps of 2 micro-steps each, clipped, with `optimizer`; every rank has its own
// data. Checks the reducer's invariants on the way; returns the final parameters.
template <class Optimizer>
int train_variant(const Variant& v, const std::string& optimizer_name, torch::Tensor& out) {
  using Acc = accelerate::Accelerator<accelerate::Gloo, accelerate::Fp32, accelerate::AccumulateDynamic,
                                      accelerate::ClipNorm<>>;
  Acc acc{{.accumulation = {.num_steps = 2},
           .clip = {.max_norm = 0.5},
           .process_group = {.timeout = 60s},
           .ddp = {.bucket_cap_bytes = 512,
                   .first_bucket_cap_bytes = 64,
                   .gradient_as_bucket_view = v.views,
                   .bucket_order_from_arrival = v.arrival,
                   .sum_in_rank_order = !v.ring}}};
  torch::manual_seed(7);
  Reversed net;
  std::unique_ptr<Optimizer> raw;
  if constexpr (std::is_same_v<Optimizer, torch::optim::SGD>)
    raw = std::make_unique<Optimizer>(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  else
    raw = std::make_unique<Optimizer>(net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  auto [model, opt] = acc.prepare(net, *raw);
  auto* reducer = model.model_sync().reducer();
  if (reducer == nullptr || reducer->bucket_count() < 3) return 10;
  const int world = acc.num_processes();
  if (reducer->sums_in_rank_order() != (world > 2 && !v.ring)) return 16;  // two ranks keep the all-reduce
  if (reducer->reduction().name() != (world > 2 && !v.ring ? "rank_ordered_sum" : "all_reduce")) return 17;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + acc.process_index());
  const std::int64_t bytes = parameter_bytes(*net);
  for (int micro = 0; micro < 40; ++micro) {
    auto step = acc.accumulate(model);
    const auto x = torch::randn({8, 8}, gen);
    const auto y = torch::randn({8, 4}, gen);
    acc.backward(torch::mse_loss(model(x), y));
    if (step.sync_gradients()) {
      // One copy of the gradients with views, two with copies (the buckets and the .grad);
      // summed in rank order, each bucket padded to a multiple of the world size.
      const auto held = static_cast<std::int64_t>(reducer->gradient_memory_bytes());
      const auto buckets = static_cast<std::int64_t>(reducer->bucket_count());
      const auto padding = reducer->sums_in_rank_order() ? buckets * (world - 1) * 4 : 0;
      const auto expected = v.views ? bytes : 2 * bytes;
      if (held < expected || held > expected + padding) {
        std::cerr << v.name << ": gradient memory " << held << " B for " << bytes << " B of parameters\n";
        return 11;
      }
    }
    if (micro == 1 && v.arrival) {
      // Rebuilt after the first synchronised backward: the head's gradients come first.
      const auto layout = reducer->bucket_layout();
      const std::set<std::size_t> first(layout.front().begin(), layout.front().end());
      if (!reducer->buckets_rebuilt() || first != std::set<std::size_t>{0, 1}) {
        std::cerr << v.name << ": buckets not rebuilt in arrival order\n";
        return 12;
      }
    }
    opt.step();
    opt.zero_grad(v.set_to_none);
  }
  // Registration order waits for the stem's gradients, which come last, before launching
  // anything: one launch per round (the stem's bias bucket, before its weight) overlaps.
  // Arrival order launches the head's and the body's buckets while backward still runs.
  if (!v.arrival && reducer->overlapped_launches() > 20) return 13;
  if (v.arrival && reducer->overlapped_launches() < 1 + 19 * 2) return 14;
  if (v.views) {
    for (const auto& p : net->parameters())
      if (v.set_to_none == p.grad().defined()) return 15;  // zero_grad(false) keeps the view
  }
  out = flat_parameters(*net);
  return 0;
}

ACCELERATE_WORKER(reducer_variants) {
  for (const auto& v : kVariants) {
    for (const std::string optimizer : {"sgd", "adamw"}) {
      torch::Tensor params;
      const int code = optimizer == "sgd" ? train_variant<torch::optim::SGD>(v, optimizer, params)
                                          : train_variant<torch::optim::AdamW>(v, optimizer, params);
      if (code != 0) return code;
      const auto rank = std::getenv("RANK");
      save_tensor(job_dir() / (std::string(v.name) + "_" + optimizer + "_rank" + rank + ".bin"), params);
    }
  }
  return 0;
}

class ReducerVariants : public ::testing::TestWithParam<int> {};

// Bucket views change where gradients live, never a bit of the result. Arrival order changes
// which buckets hold which parameters and at which position, and nothing else: every variant
// is bit-identical to the reference on 2 and 3 ranks. On 3 that takes the sums in rank order
// (the default): Gloo's ring all-reduce adds up each element starting from a rank that
// depends on the element's position in its bucket, so a parameter that moved may be summed
// as (a + b) + c instead of (b + c) + a and differ in the last bit (measured: 1 ulp after 20
// AdamW steps), which the ring variant, compared within rounding, shows.
TEST_P(ReducerVariants, GiveBitIdenticalParametersToCopies) {
  const int world = GetParam();
  auto job = run_job("reducer_variants", {.world_size = world});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  for (const std::string optimizer : {"sgd", "adamw"}) {
    const auto file = [&](const Variant& v, int r) {
      return job.dir / (std::string(v.name) + "_" + optimizer + "_rank" + std::to_string(r) + ".bin");
    };
    const auto reference = load_tensor(file(kVariants[0], 0));  // copies, registration order
    for (int r = 0; r < world; ++r)
      for (const auto& v : kVariants) {
        const auto params = load_tensor(file(v, r));
        if (world == 2 || !v.ring) {
          EXPECT_TRUE(torch::equal(params, reference)) << v.name << " with " << optimizer << " on rank " << r
                                                       << ": " << (params - reference).abs().max().item<double>();
        }
        EXPECT_LE((params - reference).abs().max().item<double>(), 1e-6) << v.name << " with " << optimizer;
      }
  }
}
INSTANTIATE_TEST_SUITE_P(Ranks, ReducerVariants, ::testing::Values(2, 3));

accelerate::DdpOptions compression_from_args() {
  const std::string args = test_args();
  accelerate::DdpOptions ddp{.bucket_cap_bytes = 1024, .first_bucket_cap_bytes = 64};
  if (args.find("fp16") != std::string::npos) ddp.compression = accelerate::GradientCompression::fp16;
  if (args.find("bf16") != std::string::npos) ddp.compression = accelerate::GradientCompression::bf16;
  if (args.find("power_sgd") != std::string::npos) {
    ddp.compression = accelerate::GradientCompression::power_sgd;
    ddp.power_sgd.start_iteration = 2;  // two rounds uncompressed, then compressed
    ddp.power_sgd.rank = args.find("full_rank") != std::string::npos ? 32 : 1;
    if (args.find("full_rank") != std::string::npos) ddp.power_sgd.min_compression_rate = 1e-9;
  }
  return ddp;
}

// Synchronised gradients against the mean of the ranks' local ones, and the bytes each round
// sent. Prints "round <k> bytes <b> error <e>" per round for the test to read.
ACCELERATE_WORKER(compressed_buckets) {
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 60s}, .ddp = compression_from_args()}};
  torch::manual_seed(3);
  accelerate::testing::TinyNet net(8, 32, 4);
  auto [model] = acc.prepare(net);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(50 + acc.process_index());
  for (int round = 0; round < 4; ++round) {
    const auto x = torch::randn({16, 8}, gen);
    {
      auto local_only = acc.no_sync(model);
      acc.backward(model(x).pow(2).mean());
    }
    const auto local = flat_gradients(*net).clone();
    for (auto& p : net->parameters()) p.mutable_grad().reset();
    const auto expected = acc.gather(local.unsqueeze(0)).mean(0);
    const auto before = acc.stats().gradient_allreduce.bytes;
    acc.backward(model(x).pow(2).mean());
    const auto sent = acc.stats().gradient_allreduce.bytes - before;
    const auto synced = flat_gradients(*net).clone();
    for (auto& p : net->parameters()) p.mutable_grad().reset();
    const double error = ((synced - expected).abs().max() / expected.abs().max()).item<double>();
    // fc1.weight's averaged gradient, whose singular values say what rank it has.
    const auto fc1 = synced.narrow(0, 0, 32 * 8).view({32, 8});
    const auto singular = torch::linalg_svdvals(fc1);
    std::cout << "round " << round << " bytes " << sent << " error " << error << " second_singular_ratio "
              << (singular[1] / singular[0]).item<double>() << std::endl;
    const auto all = acc.gather(synced.unsqueeze(0));
    if (!torch::equal(all[0], all[1])) return 3;  // every rank ends with the same gradients
  }
  return 0;
}

struct Round {
  std::uint64_t bytes = 0;
  double error = 0;
  double second_singular_ratio = 0;
};
std::vector<Round> rounds_of(const std::string& log) {
  std::vector<Round> rounds;
  std::istringstream in(log);
  std::string word;
  while (in >> word)
    if (word == "round") {
      int index;
      std::string label;
      Round r;
      in >> index >> label >> r.bytes >> label >> r.error >> label >> r.second_singular_ratio;
      rounds.push_back(r);
    }
  return rounds;
}

// TinyNet(8, 32, 4): fc1 32x8 + 32, fc2 4x32 + 4 = 420 fp32 values, 1680 bytes.
constexpr std::uint64_t kUncompressedBytes = 420 * 4;

TEST(CompressedBuckets, Fp16AndBf16SendHalfTheBytesAndAverageWithinTheirPrecision) {
  for (const std::string kind : {"fp16", "bf16"}) {
    auto job = run_job("compressed_buckets", {.world_size = 2, .args = {kind}});
    ASSERT_EQ(job.exit_code, 0) << job.logs();
    const auto rounds = rounds_of(job.log(0));
    ASSERT_EQ(rounds.size(), 4u) << job.log(0);
    for (const auto& r : rounds) {
      EXPECT_EQ(r.bytes, kUncompressedBytes / 2) << kind;
      EXPECT_LT(r.error, kind == "fp16" ? 2e-3 : 1.6e-2) << kind;  // 11 and 8 bits of mantissa
      EXPECT_GT(r.error, 0.0) << kind << ": compression left no trace; was it applied?";
    }
  }
}

TEST(CompressedBuckets, PowerSgdSendsLowRankFactorsAfterItsStartIteration) {
  auto job = run_job("compressed_buckets", {.world_size = 2, .args = {"power_sgd"}});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  const auto rounds = rounds_of(job.log(0));
  ASSERT_EQ(rounds.size(), 4u) << job.log(0);
  for (int k = 0; k < 2; ++k) {  // before start_iteration: plain sums
    EXPECT_EQ(rounds[k].bytes, kUncompressedBytes);
    EXPECT_LT(rounds[k].error, 1e-6);
  }
  // Rank 1: biases as they are (36), P and Q of fc1 (32 + 8) and of fc2 (4 + 32).
  for (int k = 2; k < 4; ++k) {
    EXPECT_EQ(rounds[k].bytes, (36u + 40u + 36u) * 4u);
    EXPECT_LT(rounds[k].second_singular_ratio, 1e-5) << "fc1's gradient is not rank 1";
    EXPECT_GT(rounds[k].error, 1e-3) << "a rank-1 approximation of a random gradient is not exact";
  }
}

// With r = min(n, m) the power iteration spans the whole matrix: the approximation is the
// average itself (up to rounding), which checks P, Q, the orthonormalisation and the scaling.
TEST(CompressedBuckets, PowerSgdOfFullRankIsTheAverage) {
  auto job = run_job("compressed_buckets", {.world_size = 2, .args = {"power_sgd full_rank"}});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  const auto rounds = rounds_of(job.log(0));
  ASSERT_EQ(rounds.size(), 4u) << job.log(0);
  for (int k = 2; k < 4; ++k) {
    EXPECT_EQ(rounds[k].bytes, (36u + (32u * 8u + 8u * 8u) + (4u * 4u + 32u * 4u)) * 4u);
    EXPECT_LT(rounds[k].error, 1e-4);
  }
}

// A .grad the user assigned (not the bucket's view) before a synchronised backward: backward
// accumulates into it, the hook copies it into the bucket and makes .grad the view again, and
// the average is what the copying reducer gives, bit for bit.
ACCELERATE_WORKER(user_assigned_grad) {
  std::vector<torch::Tensor> results;
  for (const bool views : {false, true}) {
    accelerate::Accelerator<accelerate::Gloo> acc{
        {.process_group = {.timeout = 60s}, .ddp = {.gradient_as_bucket_view = views}}};
    torch::manual_seed(3);
    accelerate::testing::TinyNet net(8, 32, 4);
    auto [model] = acc.prepare(net);
    auto* reducer = model.model_sync().reducer();
    auto gen = at::make_generator<at::CPUGeneratorImpl>(60 + acc.process_index());
    acc.backward(model(torch::randn({16, 8}, gen)).pow(2).mean());  // views in place from here
    std::vector<torch::Tensor> assigned;
    for (auto& p : net->parameters()) {
      p.mutable_grad() = torch::full_like(p, 0.5 + acc.process_index());  // the user's own tensors
      assigned.push_back(p.grad());
    }
    acc.backward(model(torch::randn({16, 8}, gen)).pow(2).mean());
    results.push_back(flat_gradients(*net).clone());
    const auto held = static_cast<std::int64_t>(reducer->gradient_memory_bytes());
    const std::int64_t bytes = parameter_bytes(*net);
    if (held != (views ? bytes : 2 * bytes)) return 3;  // views again: one copy
    std::size_t k = 0;
    for (const auto& p : net->parameters())  // the copying reducer writes into the user's tensor
      if ((p.grad().data_ptr() == assigned[k++].data_ptr()) == views) return 4;
    const auto all = acc.gather(results.back().unsqueeze(0));
    if (!torch::equal(all[0], all[1])) return 5;
  }
  return torch::equal(results[0], results[1]) ? 0 : 6;
}

TEST(BucketViews, AUserAssignedGradIsCopiedInAndReplacedByTheView) {
  auto job = run_job("user_assigned_grad", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
}

// Six synchronised steps of the reversed model with PowerSGD from round 3; the first job saves
// after step `save_at` (third argument, default 2, counted from 0) and goes on, the second
// loads that checkpoint and does the remaining steps ("resume_other_world": on another number
// of processes). Each step's data depends only on the rank and the step. Writes the final
// parameters, the bucket layout at the checkpoint and the bytes of the steps after it.
ACCELERATE_WORKER(resume_layout) {
  const auto args = accelerate::testing::worker_arguments();
  const bool resume = args.at(0) != "straight";
  const std::filesystem::path dir = args.at(1);
  const int save_at = args.size() > 2 ? std::stoi(args.at(2)) : 2;
  accelerate::DdpOptions ddp{.bucket_cap_bytes = 512, .first_bucket_cap_bytes = 64,
                             .compression = accelerate::GradientCompression::power_sgd};
  ddp.power_sgd = {.rank = 1, .start_iteration = 3};
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 60s}, .ddp = ddp}};
  torch::manual_seed(7);
  Reversed net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto [model, opt] = acc.prepare(net, sgd);
  auto* reducer = model.model_sync().reducer();
  const std::string rank = std::to_string(acc.process_index());
  auto layout_text = [&] {
    std::ostringstream text;
    for (const auto& bucket : reducer->bucket_layout()) {
      for (auto index : bucket) text << index << ' ';
      text << "| ";
    }
    return text.str();
  };
  std::ostringstream bytes;
  int first = 0;
  if (resume) {
    acc.load_state(dir / "state", {.allow_world_size_change = args.at(0) == "resume_other_world"});
    first = save_at + 1;
    std::ofstream(job_dir() / ("layout_rank" + rank)) << layout_text();
  }
  for (int step = first; step < 6; ++step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * acc.process_index() + step);
    const auto x = torch::randn({8, 8}, gen);
    const auto y = torch::randn({8, 4}, gen);
    const auto before = acc.stats().gradient_allreduce.bytes;
    opt.zero_grad();
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    if (step > save_at) bytes << (acc.stats().gradient_allreduce.bytes - before) << ' ';
    if (!resume && step == save_at) {
      acc.save_state(dir / "state");
      std::ofstream(job_dir() / ("layout_rank" + rank)) << layout_text();
    }
  }
  std::ofstream(job_dir() / ("bytes_rank" + rank)) << bytes.str();
  save_tensor(job_dir() / ("params_rank" + rank + ".bin"), flat_parameters(*net));
  return 0;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A checkpoint keeps the bucket order and the count of synchronised rounds: the resumed run
// starts in the rebuilt layout (not registration order, which on 3 ranks sums moved
// parameters in another order) and PowerSGD compresses from its first step, as the
// uninterrupted run does, so the two end bit for bit the same.
TEST(GradientSyncState, ResumesInTheSavedLayoutAndRoundCount) {
  accelerate::testing::TempDir dir;
  auto straight = run_job("resume_layout", {.world_size = 3, .args = {"straight", dir.path().string()}});
  ASSERT_EQ(straight.exit_code, 0) << straight.logs();
  auto resumed = run_job("resume_layout", {.world_size = 3, .args = {"resume", dir.path().string()}});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.logs();
  for (int r = 0; r < 3; ++r) {
    const std::string rank = std::to_string(r);
    EXPECT_EQ(read_text(resumed.dir / ("layout_rank" + rank)), read_text(straight.dir / ("layout_rank" + rank)));
    EXPECT_EQ(read_text(resumed.dir / ("bytes_rank" + rank)), read_text(straight.dir / ("bytes_rank" + rank)));
    const auto a = load_tensor(straight.dir / ("params_rank" + rank + ".bin"));
    const auto b = load_tensor(resumed.dir / ("params_rank" + rank + ".bin"));
    EXPECT_TRUE(torch::equal(a, b)) << "rank " << r << ": " << (a - b).abs().max().item<double>();
  }
}

// Saved after two compressed steps, PowerSGD's warm-start Q, each rank's error feedback and
// its generator travel in random_states_<rank>: the resumed run ends bit for bit as the
// uninterrupted one. Loaded by another number of processes (whose error feedback would belong
// to other ranks), every rank starts compression afresh alike and trains on, ranks identical.
TEST(GradientSyncState, ResumesPowerSgdStateExactly) {
  accelerate::testing::TempDir dir;
  auto straight = run_job("resume_layout", {.world_size = 3, .args = {"straight", dir.path().string(), "4"}});
  ASSERT_EQ(straight.exit_code, 0) << straight.logs();
  auto resumed = run_job("resume_layout", {.world_size = 3, .args = {"resume", dir.path().string(), "4"}});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.logs();
  for (int r = 0; r < 3; ++r) {
    const std::string rank = std::to_string(r);
    const auto a = load_tensor(straight.dir / ("params_rank" + rank + ".bin"));
    const auto b = load_tensor(resumed.dir / ("params_rank" + rank + ".bin"));
    EXPECT_TRUE(torch::equal(a, b)) << "rank " << r << ": " << (a - b).abs().max().item<double>();
  }
  auto other = run_job("resume_layout", {.world_size = 2, .args = {"resume_other_world", dir.path().string(), "4"}});
  ASSERT_EQ(other.exit_code, 0) << other.logs();
  const auto rank0 = load_tensor(other.dir / "params_rank0.bin");
  EXPECT_TRUE(torch::equal(rank0, load_tensor(other.dir / "params_rank1.bin")));
  EXPECT_TRUE(torch::isfinite(rank0).all().item<bool>());
}

ACCELERATE_WORKER(exposed_time) {
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 60s}}};
  torch::manual_seed(3);
  accelerate::testing::TinyNet net(8, 32, 4);
  auto [model] = acc.prepare(net);
  const auto x = torch::randn({16, 8});
  acc.backward(model(x).pow(2).mean());
  const auto first = acc.stats();
  if (first.last_step.busy_seconds <= 0 || first.time.busy_seconds < first.last_step.busy_seconds) return 3;
  // Rank 1 arrives late at an explicit all-reduce: rank 0 waits for it, and that wait belongs
  // to the step that ends with the next synchronised backward.
  if (acc.process_index() == 1) std::this_thread::sleep_for(400ms);
  const auto summed = acc.reduce(torch::ones({4}), accelerate::Reduction::sum);
  if (summed[0].item<double>() != 2.0) return 9;
  const auto after_wait = acc.stats();
  acc.backward(model(x).pow(2).mean());
  const auto second = acc.stats();
  std::cout << "waited " << (after_wait.time.exposed_seconds - first.time.exposed_seconds) << " step_exposed "
            << second.last_step.exposed_seconds << " step_busy " << second.last_step.busy_seconds << " overlap "
            << second.time.overlap() << std::endl;
  if (acc.process_index() == 0) {
    if (after_wait.time.exposed_seconds - first.time.exposed_seconds < 0.3) return 4;
    if (second.last_step.exposed_seconds < 0.3) return 5;
    // Blocked for a collective means it was in flight all that time.
    if (second.last_step.busy_seconds < 0.3) return 6;
  }
  // The step's time is the difference of the running totals.
  const auto expected = second.time - first.time;
  if (std::abs(second.last_step.exposed_seconds - expected.exposed_seconds) > 1e-9) return 7;
  if (second.time.overlap() < 0 || second.time.overlap() > 1) return 8;
  return 0;
}

TEST(CommunicationTime, CountsTheWaitOfTheStepItBelongsTo) {
  auto job = run_job("exposed_time", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
}

}  // namespace
