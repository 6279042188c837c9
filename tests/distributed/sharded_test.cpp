// Sharded data parallel (Zero<Gloo, 1|2|3>) with real processes: the same parameters as data
// parallel after 20 steps (SGD with momentum and AdamW, with and without accumulation and
// clipping, 2 and 3 ranks, a parameter count no world size divides, several buckets), the
// optimizer state really split, gradients left only on their owners (stage 2), parameters
// released between uses and gathered unit by unit (stage 3), an exact resume from a
// checkpoint written by a job that then exited, and clear errors.
#include <accelerate/accelerate.hpp>
#include <accelerate/distributed/sharded.hpp>

#include <gtest/gtest.h>

#if defined(__GLIBC__)
#include <malloc.h>  // mallinfo2
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "../support/errors.hpp"
#include "../support/prelude.hpp"
#include "../support/temp_dir.hpp"

namespace {

using namespace accelerate::testing::prelude;

// A sharded engine's models are prepared through its sharded reducer only: data parallel's
// make_model_sync (an unsharded reducer) is out of reach through the core.
template <class Core>
concept prepares_models_unsharded = requires(Core& core, torch::nn::Module& module,
                                             const accelerate::AcceleratorOptions& options) {
  core.make_model_sync(module, std::string("model"), options);
};
static_assert(prepares_models_unsharded<accelerate::distributed::ProcessGroupCore>);
static_assert(!prepares_models_unsharded<accelerate::distributed::ShardedCore>);

constexpr int64_t kIn = 6, kHidden = 5, kOut = 3;  // 53 parameters: no world size > 1 divides them
constexpr int64_t kPerRankBatch = 4;
constexpr int kSteps = 20;

template <class Backend>
using ShardTestAccelerator =
    accelerate::Accelerator<Backend, accelerate::Fp32, accelerate::AccumulateDynamic, accelerate::ClipNorm<>>;

// How the 53 parameters fall into buckets.
enum class Buckets {
  one,       // the default caps: one bucket
  small,     // 3 buckets of 33, 12 and 8 elements
  separate,  // a bucket per parameter: the gradients whose length the world size divides
             // become their bucket's buffer (30 elements at 2 ranks; 30, 15 and 3 at 3)
};

struct Config {
  bool adamw;
  std::size_t accumulation;
  double max_norm;  // 1e9: the norm is measured and reduced but never clips
  Buckets buckets;
  std::string name() const {
    return std::string(adamw ? "adamw" : "sgd") + "_acc" + std::to_string(accumulation) +
           (max_norm < 1e6 ? "_clip" : "_noclip") +
           (buckets == Buckets::small ? "_buckets" : buckets == Buckets::separate ? "_separate" : "");
  }
};

// The configurations every backend trains: SGD with several buckets, AdamW with one.
Config config_for(bool adamw, std::size_t accumulation, double max_norm) {
  const Buckets buckets = adamw ? Buckets::one : accumulation == 1 ? Buckets::small : Buckets::separate;
  return {adamw, accumulation, max_norm, buckets};
}

accelerate::AcceleratorOptions options_for(const Config& config) {
  accelerate::AcceleratorOptions options;
  options.process_group.timeout = 60s;
  options.accumulation.num_steps = config.accumulation;
  options.clip.max_norm = config.max_norm;
  if (config.buckets == Buckets::small) {
    options.ddp.first_bucket_cap_bytes = 40;
    options.ddp.bucket_cap_bytes = 100;
  } else if (config.buckets == Buckets::separate) {
    options.ddp.first_bucket_cap_bytes = 1;
    options.ddp.bucket_cap_bytes = 1;
  }
  return options;
}

// The batch of micro-step `micro` for this rank: a fixed slice of one dataset, so every
// backend sees the same data.
std::pair<torch::Tensor, torch::Tensor> batch(int micro, int rank, int world) {
  static const auto data = accelerate::testing::regression_data(4096, kIn, kOut);
  const int64_t start = (static_cast<int64_t>(micro) * world + rank) * kPerRankBatch;
  return {data.inputs().narrow(0, start, kPerRankBatch), data.targets().narrow(0, start, kPerRankBatch)};
}

// The model's parameters as one flat tensor, in state_dict order, from get_state_dict (stage 3
// keeps none whole between steps; every rank calls it).
template <class Acc, class Model>
torch::Tensor whole_parameters(Acc& acc, Model& model) {
  const auto state = acc.get_state_dict(model);
  std::vector<torch::Tensor> flat;
  for (const auto& [name, tensor] : accelerate::checkpoint::named_tensors(*model))
    flat.push_back(state.at(name).reshape(-1));
  return torch::cat(flat);
}

// A worker's exit code: 0, or 3 after printing the problems it found (the test shows the log).
int exit_code(const std::string& problems) {
  if (problems.empty()) return 0;
  std::cerr << problems << "\n";
  return 3;
}

// Trains kSteps optimizer steps; returns the problems found (empty when fine).
template <class Backend, class Optimizer>
std::string train(const Config& config, const std::string& tag) {
  ShardTestAccelerator<Backend> acc{options_for(config)};
  torch::manual_seed(5);
  if (acc.process_index() > 0) torch::manual_seed(100 + acc.process_index());  // prepare broadcasts rank 0's
  TinyNet net(kIn, kHidden, kOut);
  Optimizer optimizer = [&] {
    if constexpr (std::is_same_v<Optimizer, torch::optim::AdamW>)
      return torch::optim::AdamW(net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
    else
      return torch::optim::SGD(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  }();
  auto [model, opt] = acc.prepare(net, optimizer);
  std::string problems;
  int micro = 0;
  for (int step = 0; step < kSteps; ++step) {
    for (std::size_t m = 0; m < config.accumulation; ++m, ++micro) {
      auto scope = acc.accumulate(model);
      auto [x, y] = batch(micro, acc.process_index(), acc.num_processes());
      acc.backward(torch::mse_loss(model(x), y));
      if (!acc.sync_gradients()) continue;
      if constexpr (!std::is_same_v<Backend, accelerate::Gloo>) {
        // The model's parameters hold no gradient; the optimizer's slices do.
        for (const auto& p : net->parameters()) {
          if (p.grad().defined()) problems += "a model parameter kept its gradient; ";
          if (Backend::stage == 3 && p.numel() != 0) problems += "a parameter stayed gathered after backward; ";
        }
        std::int64_t with_grad = 0;
        for (const auto& group : opt.param_groups())
          for (const auto& slice : group.params()) with_grad += slice.grad().defined() ? slice.numel() : 0;
        if (with_grad == 0 && acc.process_index() == 0) problems += "no slice has a gradient; ";
      }
      opt.step();
      opt.zero_grad();
    }
  }
  // The optimizer state this rank holds, in elements of its first state tensor per parameter.
  std::int64_t state_elements = 0;
  for (const auto& group : opt.param_groups())
    for (const auto& slice : group.params()) state_elements += slice.numel();
  const auto all = acc.gather(torch::tensor({state_elements}));
  if constexpr (!std::is_same_v<Backend, accelerate::Gloo>) {
    if (acc.is_main_process() && all.sum().template item<std::int64_t>() != 53)
      problems += "the ranks' slices add up to " + std::to_string(all.sum().template item<std::int64_t>()) +
                  " elements, not the model's 53; ";
    if (state_elements >= 53) problems += "rank " + std::to_string(acc.process_index()) + " holds all the state; ";
    const auto stats = acc.stats();
    if (stats.allgather.calls == 0) problems += "no parameter all-gather; ";
    if (Backend::stage >= 2 && stats.reduce_scatter.calls == 0) problems += "no gradient reduce-scatter; ";
    if (Backend::stage == 1 && stats.gradient_allreduce.calls == 0) problems += "no gradient all-reduce; ";
    const auto adopted = model.model_sync().reducer()->adopted_gradients();
    if (Backend::stage >= 2 && (config.buckets == Buckets::separate) != (adopted > 0))
      problems += "stage " + std::to_string(Backend::stage) + ", " + config.name() + ": " + std::to_string(adopted) +
                  " gradients became their bucket's buffer; ";
  }
  save_tensor(job_dir() / (tag + "_" + config.name() + "_rank" + std::to_string(acc.process_index()) + ".bin"),
              whole_parameters(acc, model));
  return problems;
}

template <class Backend>
std::string train_all(const std::string& tag) {
  std::string problems;
  for (const bool adamw : {false, true})
    for (const std::size_t accumulation : {std::size_t{1}, std::size_t{2}})
      for (const double max_norm : {1e9, 0.05}) {
        const Config config = config_for(adamw, accumulation, max_norm);
        problems += adamw ? train<Backend, torch::optim::AdamW>(config, tag)
                          : train<Backend, torch::optim::SGD>(config, tag);
      }
  return problems;
}

ACCELERATE_WORKER(zero_against_ddp) {
  const std::string problems = train_all<accelerate::Gloo>("ddp") + train_all<accelerate::Zero<accelerate::Gloo, 1>>("zero1") +
                               train_all<accelerate::Zero<accelerate::Gloo, 2>>("zero2") +
                               train_all<accelerate::Zero<accelerate::Gloo, 3>>("zero3");
  return exit_code(problems);
}

class Sharded : public ::testing::TestWithParam<int> {};

TEST_P(Sharded, EveryStageGivesDataParallelsParameters) {
  const int world = GetParam();
  auto job = run_job("zero_against_ddp", {.world_size = world});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  int compared = 0;
  for (const bool adamw : {false, true})
    for (const std::size_t accumulation : {std::size_t{1}, std::size_t{2}})
      for (const double max_norm : {1e9, 0.05}) {
        const Config config = config_for(adamw, accumulation, max_norm);
        const auto ddp = load_tensor(job.dir / ("ddp_" + config.name() + "_rank0.bin"));
        for (const char* stage : {"zero1", "zero2", "zero3"})
          for (int r = 0; r < world; ++r) {
            const auto sharded = load_tensor(job.dir / (std::string(stage) + "_" + config.name() + "_rank" +
                                                        std::to_string(r) + ".bin"));
            EXPECT_LE((sharded - ddp).abs().max().item<double>(), 1e-6) << stage << " " << config.name() << " rank " << r;
            ++compared;
          }
      }
  EXPECT_EQ(compared, 8 * 3 * world);
}
INSTANTIATE_TEST_SUITE_P(Ranks, Sharded, ::testing::Values(2, 3));

// --- checkpoints: a job saves and exits; another resumes and ends where one job would ----------

template <class Backend>
void resume_phase(const std::string& phase) {
  ShardTestAccelerator<Backend> acc{options_for({true, 2, 0.05, Buckets::small})};
  torch::manual_seed(5);
  TinyNet net(kIn, kHidden, kOut);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  auto [model, opt] = acc.prepare(net, optimizer);
  const std::filesystem::path checkpoint = std::getenv("SHARD_TEST_SHARED");
  int first = 0, last = kSteps;
  if (phase == "first") last = kSteps / 2;
  if (phase == "grow") last = 0;
  if (phase == "second") {
    acc.load_state(checkpoint);
    first = kSteps / 2;
  }
  for (int step = first; step < last; ++step)
    for (int m = 0; m < 2; ++m) {
      auto scope = acc.accumulate(model);
      auto [x, y] = batch(step * 2 + m, acc.process_index(), acc.num_processes());
      acc.backward(torch::mse_loss(model(x), y));
      opt.step();
      opt.zero_grad();
    }
  if (phase == "first") acc.save_state(checkpoint);
  const auto params = whole_parameters(acc, model);
  if (phase == "first" && acc.is_main_process()) save_tensor(checkpoint.parent_path() / "first_params.bin", params);
  if (phase == "grow") {  // a 2-rank checkpoint resumed by 3 ranks: the same model
    acc.load_state(checkpoint, {.allow_world_size_change = true});
    const auto grown = whole_parameters(acc, model);
    if (acc.is_main_process()) save_tensor(job_dir() / "grown_params.bin", grown);
  }
  if (phase != "first") save_tensor(job_dir() / ("params_rank" + std::to_string(acc.process_index()) + ".bin"), params);
}

ACCELERATE_WORKER(zero_resume) {
  const std::string args = std::getenv("ACCELERATE_TEST_ARGS");
  const std::string phase = args.substr(0, args.find('\n'));  // run_job passes one argument per line
  if (args.find("stage1") != std::string::npos) resume_phase<accelerate::Zero<accelerate::Gloo, 1>>(phase);
  else if (args.find("stage2") != std::string::npos) resume_phase<accelerate::Zero<accelerate::Gloo, 2>>(phase);
  else resume_phase<accelerate::Zero<accelerate::Gloo, 3>>(phase);
  return 0;
}

class ShardedCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardedCheckpoint, ResumesInANewJobExactly) {
  const std::string stage = GetParam();
  accelerate::testing::TempDir shared;
  const auto checkpoint = shared / "checkpoint";
  const std::map<std::string, std::string> env{{"SHARD_TEST_SHARED", checkpoint.string()}};
  auto whole = run_job("zero_resume", {.world_size = 2, .env = env, .args = {"whole", stage}});
  ASSERT_EQ(whole.exit_code, 0) << whole.logs();
  // The second half runs in a new job that reads what the first job left in the shared folder.
  auto first = run_job("zero_resume", {.world_size = 2, .env = env, .args = {"first", stage}});
  ASSERT_EQ(first.exit_code, 0) << first.logs();
  // Each rank wrote its own optimizer shard, with a manifest of the slices it holds.
  std::int64_t held = 0;
  std::string listing;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoint)) listing += entry.path().filename().string() + " ";
  for (int r = 0; r < 2; ++r) {
    const auto stem = checkpoint / ("optimizer_rank" + std::to_string(r));
    ASSERT_TRUE(std::filesystem::exists(stem.string() + ".safetensors")) << stem << " in " << listing;
    std::ifstream json(stem.string() + ".json");
    ASSERT_TRUE(json.good()) << stem;
    const auto values = nlohmann::json::parse(json);
    ASSERT_TRUE(values.contains("shards")) << values.dump();
    EXPECT_EQ(values["shards"]["rank"], r);
    EXPECT_EQ(values["shards"]["world_size"], 2);
    for (const auto& piece : values["shards"]["pieces"]) held += piece["numel"].get<std::int64_t>();
  }
  EXPECT_EQ(held, 53) << "the two shards together hold every parameter once";
  EXPECT_FALSE(std::filesystem::exists(checkpoint / "optimizer.safetensors"));
  if (stage == "stage3") {  // each rank wrote its own parameter slices too
    std::int64_t params_held = 0;
    std::string models;
    for (int r = 0; r < 2; ++r) {
      const auto stem = checkpoint / ("model_rank" + std::to_string(r));
      std::ifstream json(stem.string() + ".json");
      ASSERT_TRUE(json.good()) << stem << " in " << listing;
      const auto values = nlohmann::json::parse(json);
      ASSERT_TRUE(values.contains("shards")) << values.dump();
      for (const auto& piece : values["shards"]["pieces"]) params_held += piece["numel"].get<std::int64_t>();
      ASSERT_TRUE(std::filesystem::exists(stem.string() + ".safetensors")) << stem;
      models += values.dump() + " ";
    }
    EXPECT_EQ(params_held, 53) << models;
    EXPECT_FALSE(std::filesystem::exists(checkpoint / "model.safetensors"));
  }

  auto second = run_job("zero_resume", {.world_size = 2, .env = env, .args = {"second", stage}});
  ASSERT_EQ(second.exit_code, 0) << second.logs();
  for (int r = 0; r < 2; ++r) {
    const auto name = "params_rank" + std::to_string(r) + ".bin";
    EXPECT_TRUE(torch::equal(load_tensor(second.dir / name), load_tensor(whole.dir / name))) << "rank " << r;
  }
  // Three ranks resume the two ranks' checkpoint: parameter and optimizer slices re-cut.
  auto grown = run_job("zero_resume", {.world_size = 3, .env = env, .args = {"grow", stage}});
  ASSERT_EQ(grown.exit_code, 0) << grown.logs();
  EXPECT_TRUE(torch::equal(load_tensor(grown.dir / "grown_params.bin"), load_tensor(shared / "first_params.bin")));
}
INSTANTIATE_TEST_SUITE_P(Stages, ShardedCheckpoint, ::testing::Values("stage1", "stage2", "stage3"));

// A problem when `sharded`'s parameters differ from data parallel's by more than `tolerance`.
std::string differences(const std::string& what, const torch::Tensor& ddp, const torch::Tensor& sharded,
                        double tolerance) {
  const double difference = (ddp - sharded).abs().max().item<double>();
  if (difference <= tolerance) return "";
  return what + " differs from data parallel by " + std::to_string(difference) + "; ";
}

// The micro-steps of the unit tests: the shared batches, accumulation from the options.
template <class Acc, class Model, class Optimizer>
void train_micro_steps(Acc& acc, Model& model, Optimizer& opt, int micro_steps) {
  for (int micro = 0; micro < micro_steps; ++micro) {
    auto scope = acc.accumulate(model);
    auto [x, y] = batch(micro, acc.process_index(), acc.num_processes());
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
  }
}

// Stage 3: an evaluation forward (no backward to come) gathers and releases every unit.
template <class Acc, class Model>
std::string evaluation_problems(Acc& acc, Model& model, const torch::nn::Module& net) {
  {
    torch::NoGradGuard no_grad;
    (void)model(batch(0, acc.process_index(), acc.num_processes()).first);
  }
  for (const auto& p : net.parameters())
    if (p.numel() != 0) return "a parameter stayed gathered after an evaluation; ";
  return "";
}

// --- stage 3 unit by unit: a Sequential's children gathered around their forward and backward --

// Sits between two Linears of a Sequential and records, each time it runs, how many elements
// the first Linear's weight (unit 0) and the one just before it (unit 2) hold, and on its
// first call how many all-gathers had been started (`allgathers`, when set).
struct UnitProbeImpl : torch::nn::Module {
  UnitProbeImpl(torch::nn::Linear first, torch::nn::Linear previous) : first(first), previous(previous) {}
  torch::Tensor forward(const torch::Tensor& x) {
    seen_first = std::max(seen_first, first->weight.numel());
    seen_previous = std::max(seen_previous, previous->weight.numel());
    if (calls == 0 && allgathers) allgathers_at_first_call = allgathers();
    ++calls;
    return x;
  }
  torch::nn::Linear first, previous;
  std::int64_t seen_first = 0, seen_previous = 0, calls = 0;
  std::function<std::uint64_t()> allgathers;
  std::uint64_t allgathers_at_first_call = 0;
};
TORCH_MODULE(UnitProbe);

// `lean`: DdpOptions::prefetch_units off and sharded_buckets_in_flight 0. `built_by_unit`
// (stage 3): each Linear passed through shard_unit as it is built.
template <class Backend>
std::string train_sequential(torch::Tensor& result, const std::string& tag, bool lean = false,
                             bool built_by_unit = false) {
  auto options = options_for({true, 2, 0.05, Buckets::one});
  if (lean) {
    options.ddp.prefetch_units = false;
    options.ddp.sharded_buckets_in_flight = 0;
  }
  ShardTestAccelerator<Backend> acc{options};
  torch::manual_seed(5);
  torch::nn::Linear first(kIn, kHidden), middle(kHidden, 4), last(4, kOut);  // 35, 24 and 15 parameters
  std::string problems;
  if constexpr (requires { acc.shard_unit(first); }) {
    if (built_by_unit) {
      for (auto* unit : {&first, &middle, &last}) {  // one at a time: the same order on every rank
        {  // values only rank 0 has: shard_unit keeps rank 0's, as prepare does
          torch::NoGradGuard no_grad;
          (*unit)->weight.add_(acc.process_index());
        }
        *unit = acc.shard_unit(*unit);
        if ((*unit)->weight.numel() != 0 || (*unit)->bias.numel() != 0)
          problems += tag + ": a unit's parameters are still whole after shard_unit; ";
      }
    }
  }
  UnitProbe probe(first, middle);
  torch::nn::Sequential net(first, torch::nn::ReLU(), middle, probe, last);
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  auto [model, opt] = acc.prepare(net, optimizer);
  probe->allgathers = [&acc] { return acc.stats().allgather.calls; };
  const std::uint64_t allgathers_before = acc.stats().allgather.calls;
  const int micro_steps = 2 * 6;
  train_micro_steps(acc, model, opt, micro_steps);
  if constexpr (!std::is_same_v<Backend, accelerate::Gloo>) {
    // While the probe ran, units 0 and 2 were released (unit 4's all-gather was in flight).
    if (probe->calls != micro_steps || probe->seen_first != 0 || probe->seen_previous != 0)
      problems += "the probe saw " + std::to_string(probe->seen_first) + " and " + std::to_string(probe->seen_previous) +
                  " elements in " + std::to_string(probe->calls) + " calls; ";
    // Forward gathers the 3 units with parameters; backward regathers units 2 and 0 (the last
    // stays gathered for it): 5 all-gathers per micro-step, nothing after the step. (Built
    // unit by unit, prepare all-gathered each of the 6 parameters once before.)
    const auto stats = acc.stats();
    if (stats.allgather.calls - allgathers_before != static_cast<std::uint64_t>(5 * micro_steps) ||
        allgathers_before != (built_by_unit ? 6u : 0u))
      problems += tag + ": " + std::to_string(allgathers_before) + " + " +
                  std::to_string(stats.allgather.calls - allgathers_before) + " all-gathers, expected " +
                  std::to_string(built_by_unit ? 6 : 0) + " + " + std::to_string(5 * micro_steps) + "; ";
    // When the probe first ran units 0 and 2 had been gathered and, prefetching, unit 4's
    // all-gather had started too.
    const std::uint64_t started = probe->allgathers_at_first_call - allgathers_before;
    if (started != (lean ? 2u : 3u))
      problems += tag + ": " + std::to_string(started) + " all-gathers started before unit 3 ran; ";
    // The 3 units' buckets: two launched buckets stay alive by default, none when lean.
    const std::size_t in_flight = model.model_sync().reducer()->peak_buckets_in_flight();
    if (in_flight != (lean ? 0u : 2u))
      problems += tag + ": at most " + std::to_string(in_flight) + " launched buckets alive at once; ";
    // Evaluation: gathered and released unit by unit, no backward to come.
    problems += evaluation_problems(acc, model, *net);
    // The model state one rank holds: its slices of each unit's (padded) parameters.
    const auto estimate = accelerate::estimate_memory(acc, model, opt);
    const std::int64_t world = acc.num_processes();
    const std::int64_t slices = ((35 + world - 1) / world + (24 + world - 1) / world + (15 + world - 1) / world) * 4;
    if (estimate.parameters != slices || estimate.gradients != slices)
      problems += "estimate_memory: parameters " + std::to_string(estimate.parameters) + ", gradients " +
                  std::to_string(estimate.gradients) + ", expected " + std::to_string(slices) + " each; ";
  } else {
    if (probe->seen_first != 30 || probe->seen_previous != 20) problems += "the probe cannot see whole parameters; ";
  }
  result = whole_parameters(acc, model);
  // save_model writes the whole model, as get_state_dict has it.
  const auto out = job_dir() / tag;
  acc.save_model(model, out);
  if (acc.is_main_process()) {
    const auto saved = accelerate::checkpoint::SafetensorsFile::open(out / "model.safetensors");
    std::vector<torch::Tensor> flat;
    for (const auto& [name, tensor] : accelerate::checkpoint::named_tensors(*net)) flat.push_back(saved.tensor(name).reshape(-1));
    if (!torch::equal(torch::cat(flat), result)) problems += tag + ": save_model did not write the whole model; ";
  }
  return problems;
}

ACCELERATE_WORKER(zero3_sequential) {
  torch::Tensor ddp, zero3, lean, built;
  using Zero3 = accelerate::Zero<accelerate::Gloo, 3>;
  std::string problems = train_sequential<accelerate::Gloo>(ddp, "ddp") + train_sequential<Zero3>(zero3, "zero3") +
                         train_sequential<Zero3>(lean, "zero3_lean", /*lean=*/true) +
                         train_sequential<Zero3>(built, "zero3_built", false, /*built_by_unit=*/true);
  problems += differences("stage 3", ddp, zero3, 1e-6);
  problems += differences("stage 3 without prefetch or buckets in flight", ddp, lean, 1e-6);
  // Cut as built, the slices are rank 0's values as prepare would have broadcast them: the
  // same training to the bit.
  if (!torch::equal(zero3, built)) problems += differences("stage 3 built unit by unit", ddp, built, 0) + "(not equal to stage 3); ";
  return exit_code(problems);
}

class ShardedUnits : public ::testing::TestWithParam<int> {};

TEST_P(ShardedUnits, ASequentialsChildrenAreGatheredOneByOneAndTrainAsDataParallel) {
  auto job = run_job("zero3_sequential", {.world_size = GetParam()});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
}
INSTANTIATE_TEST_SUITE_P(Ranks, ShardedUnits, ::testing::Values(2, 3));

// --- stage 3 units in any model: DdpOptions::shard_units and accelerate::unit_forward ---------

// Not a Sequential: an encoder and a head run through unit_forward, and a parameter of the
// model itself (outside every unit). Records what it sees of the units while it runs.
struct TwoUnitNetImpl : torch::nn::Module {
  TwoUnitNetImpl()
      : encoder(register_module("encoder", torch::nn::Sequential(torch::nn::Linear(kIn, kHidden), torch::nn::Tanh()))),
        head(register_module("head", torch::nn::Linear(kHidden, kOut))),
        scale(register_parameter("scale", torch::full({kOut}, 1.5))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const auto h = accelerate::unit_forward(encoder, x);
    seen_encoder_after = std::max(seen_encoder_after, encoder->parameters()[0].numel());
    seen_scale = std::min(seen_scale, scale.numel());
    return accelerate::unit_forward(head, h) * scale;
  }
  torch::nn::Sequential encoder;
  torch::nn::Linear head;
  torch::Tensor scale;
  std::int64_t seen_encoder_after = 0, seen_scale = 1 << 20;
};
TORCH_MODULE(TwoUnitNet);

// The same, calling its encoder directly: at stage 3 with the encoder listed, an error.
struct DirectCallNetImpl : TwoUnitNetImpl {
  torch::Tensor forward(const torch::Tensor& x) { return head(encoder->forward(x)) * scale; }
};
TORCH_MODULE(DirectCallNet);

template <class Backend>
std::string train_listed_units(torch::Tensor& result) {
  auto options = options_for({true, 2, 0.05, Buckets::one});
  options.ddp.shard_units = {"encoder", "head"};  // data parallel ignores it
  ShardTestAccelerator<Backend> acc{options};
  torch::manual_seed(5);
  TwoUnitNet net;
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  auto [model, opt] = acc.prepare(net, optimizer);
  std::string problems;
  const int micro_steps = 2 * 6;
  train_micro_steps(acc, model, opt, micro_steps);
  if constexpr (!std::is_same_v<Backend, accelerate::Gloo>) {
    // Between the two units the encoder was released; the model's own parameter was whole.
    if (net->seen_encoder_after != 0 || net->seen_scale != kOut)
      problems += "between the units the encoder held " + std::to_string(net->seen_encoder_after) +
                  " elements and scale " + std::to_string(net->seen_scale) + "; ";
    // Forward: the rest, the encoder and the head (prefetched by the encoder's call); backward:
    // the head again and the encoder (prefetched by the head's hook). 5 per micro-step.
    const auto stats = acc.stats();
    if (stats.allgather.calls != 5 * micro_steps)
      problems += std::to_string(stats.allgather.calls) + " all-gathers, expected " + std::to_string(5 * micro_steps) + "; ";
    problems += evaluation_problems(acc, model, *net);
  } else if (net->seen_encoder_after != kHidden * kIn) {
    problems += "unit_forward is not the plain call under data parallel; ";
  }
  result = whole_parameters(acc, model);
  return problems;
}

ACCELERATE_WORKER(zero3_listed_units) {
  torch::Tensor ddp, zero3;
  std::string problems = train_listed_units<accelerate::Gloo>(ddp) +
                         train_listed_units<accelerate::Zero<accelerate::Gloo, 3>>(zero3);
  problems += differences("stage 3", ddp, zero3, 1e-6);

  // A listed unit called directly, names that are not submodules, units inside units.
  auto error_with = [](std::vector<std::string> units, auto net) {
    using Acc = accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 3>>;
    return accelerate::testing::error_of([&] {
      Acc acc{{.process_group = {.timeout = 60s}, .ddp = {.shard_units = units}}};
      auto [model] = acc.prepare(net);
      (void)model(torch::ones({2, kIn}));
    });
  };
  const auto direct = error_with({"encoder", "head"}, DirectCallNet());
  if (direct.find("gathered only inside accelerate::unit_forward") == std::string::npos) problems += "direct: " + direct + "; ";
  const auto unknown = error_with({"encoder", "nope"}, TwoUnitNet());
  if (unknown.find("no submodule 'nope' (its children: encoder, head)") == std::string::npos)
    problems += "unknown: " + unknown + "; ";
  const auto nested = error_with({"encoder", "encoder.0"}, TwoUnitNet());
  if (nested.find("'encoder.0' lies inside 'encoder'") == std::string::npos) problems += "nested: " + nested + "; ";
  return exit_code(problems);
}

class ShardedListedUnits : public ::testing::TestWithParam<int> {};

TEST_P(ShardedListedUnits, AnyModelsListedUnitsAreGatheredByUnitForwardAndTrainAsDataParallel) {
  auto job = run_job("zero3_listed_units", {.world_size = GetParam()});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
}
INSTANTIATE_TEST_SUITE_P(Ranks, ShardedListedUnits, ::testing::Values(2, 3));

// unit_forward outside any sharded model is the plain call, and costs one atomic load.
TEST(UnitForward, IsThePlainCallWithoutAStage3Model) {
  torch::manual_seed(1);
  torch::nn::Linear linear(3, 2);
  const auto x = torch::randn({4, 3});
  EXPECT_TRUE(torch::equal(accelerate::unit_forward(linear, x), linear(x)));
  EXPECT_TRUE(torch::equal(accelerate::unit_forward(*linear, x), linear->forward(x)));
}

// Stage 3 with the other policies: bf16 autocast, ClipValue, and Adagrad, whose state is made
// in its constructor and sliced at prepare (from the shapes the reducer keeps: the parameters
// are already released then). The same run as data parallel, up to reduction order.
template <class Backend>
torch::Tensor train_with_policies(std::string& problems) {
  accelerate::Accelerator<Backend, accelerate::Bf16, accelerate::NoAccumulation, accelerate::ClipValue> acc{
      {.clip = {.clip_value = 0.01}, .process_group = {.timeout = 60s}}};
  torch::manual_seed(5);
  torch::nn::Sequential net(torch::nn::Linear(kIn, kHidden), torch::nn::Tanh(), torch::nn::Linear(kHidden, kOut));
  torch::optim::Adagrad adagrad(net->parameters(), torch::optim::AdagradOptions(0.1).initial_accumulator_value(0.5));
  auto [model, opt] = acc.prepare(net, adagrad);
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = batch(step, acc.process_index(), acc.num_processes());
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    for (const auto& group : opt.param_groups())
      for (const auto& p : group.params()) {
        if (p.grad().defined() && p.grad().abs().max().template item<double>() > 0.01 + 1e-9) problems += "a gradient escaped ClipValue; ";
        const auto& state = static_cast<torch::optim::AdagradParamState&>(*adagrad.state().at(p.unsafeGetTensorImpl()));
        if (state.sum().sizes() != p.sizes()) problems += "an Adagrad accumulator of the wrong size; ";
      }
    opt.zero_grad();
  }
  return whole_parameters(acc, model);
}

ACCELERATE_WORKER(zero3_policies) {
  std::string problems;
  const auto ddp = train_with_policies<accelerate::Gloo>(problems);
  const auto zero3 = train_with_policies<accelerate::Zero<accelerate::Gloo, 3>>(problems);
  problems += differences("stage 3 with bf16", ddp, zero3, 1e-5);
  return exit_code(problems);
}

TEST(ShardedPolicies, Bf16ClipValueAndAdagradWorkAtStage3) {
  auto job = run_job("zero3_policies", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
}

// --- freed memory: kept when asked, handed back otherwise ---------------------------------------

#if defined(__GLIBC__)
// A sharded step ends by trimming the heap (malloc_trim: its free pages go back to the system)
// unless AcceleratorOptions::retain_freed_memory asks to keep freed memory — kept, the next
// step does not fault them in again. A 3 MB buffer (below both of glibc's mmap thresholds the
// option sets) freed before a step leaves the top of the heap free; glibc's keepcost after the
// step says whether the step handed it back. KEEP_FREED_MEMORY set: kept.
ACCELERATE_WORKER(zero3_freed_memory) {
  const bool keep = std::getenv("KEEP_FREED_MEMORY") != nullptr;
  accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 3>> acc{
      {.cpu = true, .retain_freed_memory = keep, .huge_pages = false, .process_group = {.timeout = 60s}}};
  torch::manual_seed(5);
  TinyNet net(kIn, kHidden, kOut);
  torch::optim::SGD sgd(net->parameters(), 0.05);
  auto [model, opt] = acc.prepare(net, sgd);
  auto step = [&](int i) {
    auto [x, y] = batch(i, acc.process_index(), acc.num_processes());
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
  };
  step(0);
  opt.zero_grad();
  constexpr std::size_t bytes = 3u << 20;
  void* (*volatile allocate)(std::size_t) = std::malloc;  // not elided with its free
  void* buffer = allocate(bytes);
  std::memset(buffer, 1, bytes);
  std::free(buffer);
  step(1);
  const std::size_t free_top = mallinfo2().keepcost;
  std::string problems;
  if (keep != (free_top >= bytes))
    problems += std::string(keep ? "kept" : "handed back") + ", but the free top of the heap after the step is " +
                std::to_string(free_top) + " B; ";
  return exit_code(problems);
}
#endif

TEST(ShardedMemory, AStepKeepsFreedMemoryWhenAskedAndHandsItBackOtherwise) {
#if defined(__GLIBC__)
  auto kept = run_job("zero3_freed_memory", {.world_size = 2, .env = {{"KEEP_FREED_MEMORY", "1"}}});
  EXPECT_EQ(kept.exit_code, 0) << kept.logs();
  auto returned = run_job("zero3_freed_memory", {.world_size = 2});
  EXPECT_EQ(returned.exit_code, 0) << returned.logs();
#else
  GTEST_SKIP() << "the C library is not glibc: there is no heap to trim";
#endif
}

// --- fp16: an inf in one rank's slice makes every rank skip the step ---------------------------

ACCELERATE_WORKER(zero_fp16_skip) {
  accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 2>, accelerate::Fp16> acc{
      {.cpu = true, .process_group = {.timeout = 60s}}};
  torch::manual_seed(5);
  TinyNet net(kIn, kHidden, kOut);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto [model, opt] = acc.prepare(net, sgd);
  std::string problems;
  const double scale = acc.loss_scale();
  for (int step = 0; step < 2; ++step) {
    auto [x, y] = batch(step, acc.process_index(), acc.num_processes());
    acc.backward(torch::mse_loss(model(x), y));
    const auto before = flat_parameters(*net);
    const bool poison = step == 0;
    if (poison && acc.process_index() == 0) {  // only rank 0's slice holds it
      torch::NoGradGuard no_grad;
      opt.param_groups()[0].params()[0].grad()[0] = std::numeric_limits<float>::infinity();
    }
    opt.step();
    opt.zero_grad();
    if (opt.step_was_skipped() != poison) problems += "step " + std::to_string(step) + " skipped: " + std::to_string(opt.step_was_skipped()) + "; ";
    if (poison != torch::equal(before, flat_parameters(*net))) problems += "step " + std::to_string(step) + " moved wrongly; ";
    const auto all = acc.gather(flat_parameters(*net).unsqueeze(0));
    if (!torch::equal(all[0], all[1])) problems += "ranks differ after step " + std::to_string(step) + "; ";
  }
  if (!(acc.loss_scale() < scale)) problems += "the scale did not back off; ";
  return exit_code(problems);
}

TEST(ShardedFp16, AnInfInOneRanksSliceSkipsTheStepOnEveryRank) {
  auto job = run_job("zero_fp16_skip", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
}

// --- get_state_dict and save: the whole model, from every rank, written by the main one -----

ACCELERATE_WORKER(zero_state_dict) {
  accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 2>> acc{{.process_group = {.timeout = 60s}}};
  torch::manual_seed(5);
  TinyNet net(kIn, kHidden, kOut);
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(0.01));
  auto [model, opt] = acc.prepare(net, adamw);
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = batch(step, acc.process_index(), acc.num_processes());
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
  }
  std::string problems;
  const auto state = acc.get_state_dict(model);  // every rank calls it
  if (state.size() != 4) problems += "expected 4 tensors, got " + std::to_string(state.size()) + "; ";
  std::vector<torch::Tensor> flat;
  for (const auto& [name, tensor] : state) flat.push_back(tensor.reshape(-1));
  const auto all = acc.gather(torch::cat(flat).unsqueeze(0));
  if (!torch::equal(all[0], all[1])) problems += "the ranks' state dicts differ; ";
  if (!torch::equal(state.at("fc1.weight"), net->fc1->weight.detach())) problems += "fc1.weight is not the model's; ";
  const auto path = job_dir() / "weights.safetensors";
  if (acc.save(state, path) != acc.is_main_process()) problems += "save wrote on the wrong process; ";
  acc.wait_for_everyone();
  if (acc.is_main_process()) {
    const auto loaded = accelerate::checkpoint::SafetensorsFile::open(path).tensors();
    for (const auto& [name, tensor] : state)
      if (!loaded.count(name) || !torch::equal(loaded.at(name), tensor)) problems += name + " was not written as it is; ";
  }
  return exit_code(problems);
}

TEST(ShardedStateDict, GetStateDictIsTheWholeModelOnEveryRankAndSaveWritesItOnce) {
  auto job = run_job("zero_state_dict", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
}

// --- stage 3 save_model: streamed to rank 0 one output shard at a time ------------------------

// The tensors of a saved model folder (an index and its shards, or model.safetensors), by file.
std::map<std::string, std::vector<std::string>> files_of(const std::filesystem::path& dir) {
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const auto file = entry.path().filename().string();
    if (!file.ends_with(".safetensors")) continue;
    out[file] = accelerate::checkpoint::SafetensorsFile::open(entry.path()).names();
    std::sort(out[file].begin(), out[file].end());
  }
  return out;
}

ACCELERATE_WORKER(zero3_save_model) {
  accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 3>> acc{{.process_group = {.timeout = 60s}}};
  torch::manual_seed(5);
  // Units of 35, 10 (weight and bias of the norm; its buffers stay whole) and 18 parameters.
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Linear(kIn, kHidden), torch::nn::BatchNorm1d(kHidden), torch::nn::ReLU(),
                                 torch::nn::Linear(kHidden, kOut));
  };
  auto net = make();
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(0.01));
  auto [model, opt] = acc.prepare(net, adamw);
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = batch(step, acc.process_index(), acc.num_processes());
    acc.backward(torch::mse_loss(model(x), y));
    opt.step();
    opt.zero_grad();
  }
  std::string problems;
  const int rank = acc.process_index(), world = acc.num_processes();
  const auto out = job_dir() / "model";
  std::filesystem::create_directories(out);
  if (acc.is_main_process()) std::ofstream(out / "config.json") << "{\"kept\": true}";
  acc.wait_for_everyone();

  const auto before = acc.stats();
  acc.save_model(model, out, {.max_shard_size = std::uint64_t{100}});
  const auto after = acc.stats();
  // Nothing was gathered: the parameters are still released, no all-gather ran, and each rank
  // other than 0 sent rank 0 exactly the slices it holds (its optimizer's parameters).
  for (const auto& p : net->parameters())
    if (p.numel() != 0) problems += "save_model left a parameter gathered; ";
  if (after.allgather.calls != before.allgather.calls)
    problems += std::to_string(after.allgather.calls - before.allgather.calls) + " all-gathers in save_model; ";
  std::int64_t held = 0;
  for (const auto& group : opt.param_groups())
    for (const auto& slice : group.params()) held += slice.numel();
  const auto sent = static_cast<std::int64_t>(after.point_to_point.bytes - before.point_to_point.bytes);
  const auto counts = acc.gather(torch::tensor({sent, held}, torch::kLong).unsqueeze(0));
  std::int64_t total_held = 0;
  for (int r = 0; r < world; ++r) {
    const auto r_sent = counts[r][0].item<std::int64_t>(), r_held = counts[r][1].item<std::int64_t>();
    total_held += r_held;
    if (r_sent != (r == 0 ? 0 : 4 * r_held))
      problems += "rank " + std::to_string(r) + " sent " + std::to_string(r_sent) + " bytes holding " +
                  std::to_string(r_held) + " elements; ";
  }
  if (total_held != 35 + 10 + 18) problems += "the ranks hold " + std::to_string(total_held) + " elements; ";

  // The files are what the whole model gives the same writer: same shards, same tensors.
  const auto state = acc.get_state_dict(model);  // every rank calls it
  if (acc.is_main_process()) {
    std::vector<std::pair<std::string, torch::Tensor>> ordered;
    for (const auto& [name, tensor] : accelerate::checkpoint::named_tensors(*net)) ordered.emplace_back(name, state.at(name));
    const auto reference = job_dir() / "reference";
    accelerate::checkpoint::write_model_files(ordered, reference, {.max_shard_size = std::uint64_t{100}});
    const auto streamed = files_of(out), whole = files_of(reference);
    if (streamed != whole || streamed.size() < 3)
      problems += "the streamed files differ from the whole model's (" + std::to_string(streamed.size()) + " vs " +
                  std::to_string(whole.size()) + " files); ";
    auto loaded = make();
    accelerate::load_checkpoint_in_model(*loaded, out);
    for (const auto& [name, tensor] : accelerate::checkpoint::named_tensors(*loaded))
      if (!torch::equal(tensor, state.at(name))) problems += "saved " + name + " differs from the model; ";
    if (!std::filesystem::exists(out / "config.json")) problems += "the folder's config.json was lost; ";
  }

  // A folder rank 0 cannot write: every rank ends with an error, nothing is changed.
  const auto blocked = job_dir() / "blocked";
  if (acc.is_main_process()) std::ofstream(blocked) << "not a folder";
  acc.wait_for_everyone();
  const auto error = accelerate::testing::error_of([&] { acc.save_model(model, blocked); });
  const std::string expected = rank == 0 ? "is a file, not a folder" : "rank 0 failed preparing the files";
  if (error.find(expected) == std::string::npos) problems += "blocked folder: " + error + "; ";
  acc.wait_for_everyone();
  std::ifstream kept(blocked);
  const std::string text((std::istreambuf_iterator<char>(kept)), std::istreambuf_iterator<char>());
  if (text != "not a folder") problems += "the file in the way was changed; ";
  return exit_code(problems);
}

class ShardedSaveModel : public ::testing::TestWithParam<int> {};

TEST_P(ShardedSaveModel, Stage3StreamsEachShardToRankZeroWithoutGatheringTheModel) {
  auto job = run_job("zero3_save_model", {.world_size = GetParam()});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
}
INSTANTIATE_TEST_SUITE_P(Ranks, ShardedSaveModel, ::testing::Values(2, 3));

// --- refusals, Adagrad's sliced state, clipping by model parameters, save_model --------------

ACCELERATE_WORKER(zero_errors) {
  std::string problems;
  {
    accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 2>> acc{{.process_group = {.timeout = 60s}}};
    TinyNet net(kIn, kHidden, kOut);
    torch::optim::SGD sgd(net->parameters(), 0.1);
    const auto early = accelerate::testing::error_of([&] { (void)acc.prepare(sgd); });
    if (early.find("prepare each model before its optimizers") == std::string::npos) problems += "early: " + early + "; ";
  }
  {
    accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 1>> acc{{.process_group = {.timeout = 60s}}};
    TinyNet net(kIn, kHidden, kOut);
    auto [model] = acc.prepare(net);
    torch::optim::LBFGS lbfgs(net->parameters());
    const auto refused = accelerate::testing::error_of([&] { (void)acc.prepare(lbfgs); });
    if (refused.find("element-wise optimizer") == std::string::npos) problems += "lbfgs: " + refused + "; ";
    // Adagrad makes its state in its constructor: prepare slices it.
    torch::optim::Adagrad adagrad(net->parameters(), torch::optim::AdagradOptions(0.1).initial_accumulator_value(0.5));
    auto [opt] = acc.prepare(adagrad);
    std::int64_t sliced = 0;
    for (const auto& group : opt.param_groups())
      for (const auto& slice : group.params()) {
        const auto& state = static_cast<torch::optim::AdagradParamState&>(*adagrad.state().at(slice.unsafeGetTensorImpl()));
        if (state.sum().sizes() != slice.sizes()) problems += "an accumulator of the wrong size; ";
        sliced += slice.numel();
      }
    if (adagrad.state().size() != opt.param_groups()[0].params().size()) problems += "whole-parameter state left; ";
    auto [x, y] = batch(0, acc.process_index(), acc.num_processes());
    acc.backward(torch::mse_loss(model(x), y));
    // The user's own clipping by model parameters reaches the slices that hold the gradients.
    const double norm = acc.clip_grad_norm_(net->parameters(), 1e-3);
    const double clipped = acc.clip_grad_norm_(net->parameters(), 1e9);
    if (!(norm > 1e-3) || std::abs(clipped - 1e-3) > 1e-8)
      problems += "clip_grad_norm_ measured " + std::to_string(norm) + " then " + std::to_string(clipped) + "; ";
    const auto norms = acc.gather(torch::tensor({norm}, torch::kDouble));
    if (norms[0].item<double>() != norms[1].item<double>()) problems += "ranks measured different norms; ";
    acc.clip_grad_value_(net->parameters(), 1e-5);
    for (const auto& slice : opt.param_groups()[0].params())
      if (slice.grad().defined() && slice.grad().abs().max().item<double>() > 1e-5) problems += "clip_grad_value_ missed a slice; ";
    opt.step();
    // save_model writes the whole model, the same on every rank.
    const auto out = job_dir() / "model";
    acc.save_model(model, out);
    if (acc.is_main_process()) {
      auto saved = accelerate::checkpoint::SafetensorsFile::open(out / "model.safetensors");
      if (saved.names().size() != 4) problems += "save_model wrote " + std::to_string(saved.names().size()) + " tensors; ";
      for (const auto& name : saved.names())
        if (!torch::equal(saved.tensor(name), net->named_parameters()[name].detach())) problems += "saved " + name + " differs; ";
    }
    const auto gathered = acc.gather(flat_parameters(*net).unsqueeze(0));
    if (!torch::equal(gathered[0], gathered[1])) problems += "ranks hold different models; ";
  }
  {  // shard_unit on units that differ between ranks: refused on every rank before any collective
    accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 3>> acc{{.process_group = {.timeout = 60s}}};
    torch::nn::Linear unit(kIn, kHidden + acc.process_index());
    const auto refused = accelerate::testing::error_of([&] { (void)acc.shard_unit(unit); });
    if (refused.find("shard_unit: unit #0 must have the same parameter names, dtypes and shapes on every rank") ==
        std::string::npos)
      problems += "shard_unit: " + refused + "; ";
    if (unit->weight.numel() != kIn * (kHidden + acc.process_index())) problems += "a refused unit was cut; ";
    acc.wait_for_everyone();  // the engine still works
  }
  return exit_code(problems);
}

TEST(ShardedErrors, RefusalsAdagradClippingByParameterAndSaveModel) {
  auto job = run_job("zero_errors", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
}

static_assert(accelerate::distributed::BackendEngine<accelerate::distributed::ShardedEngine<accelerate::distributed::GlooFactory, 1>>);
static_assert(accelerate::distributed::customises_step_optimizer<
              accelerate::distributed::ShardedEngine<accelerate::distributed::GlooFactory, 2>>);
static_assert(accelerate::Zero<accelerate::Gloo, 2>::name == "Zero<Gloo,2>");
static_assert(accelerate::distributed::BackendEngine<accelerate::distributed::ShardedEngine<accelerate::distributed::GlooFactory, 3>>);

}  // namespace
