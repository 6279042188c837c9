// The conformance suite every BackendEngine passes: its primitives (ranks, all_reduce of each
// reduction, broadcast, all_gather, reduce_scatter, barrier, stats, check_same_on_every_rank)
// and the collectives built on them (nested containers, uneven sizes, padding, objects,
// splitting, mismatches named on every rank). Each case is written once for any engine and
// any world size; a new engine proves itself by adding its harness to `Harnesses`.
//   LocalEngine         in-process, world size 1
//   ThreadEngine        the fake engine of tests/support, 3 threads of this process
//   Gloo engine         3 real processes (TCPStore and ProcessGroupGloo on 127.0.0.1)
//   Zero stages 1-3     the sharded engines over Gloo, 3 real processes
// NCCL's engine is the same ProcessGroupCore with another transport; it is not in this list
// yet (its cases need a GPU per process): tests/gpu/nccl_train.cpp trains on it where GPUs are
// lent.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <torch/torch.h>

#include <accelerate/accelerate.hpp>
#include <accelerate/distributed/collectives.hpp>
#include <accelerate/distributed/engine.hpp>
#include <accelerate/distributed/local_engine.hpp>
#include <accelerate/distributed/sharded.hpp>

#include "../support/multiprocess.hpp"
#include "../support/temp_dir.hpp"
#include "../support/thread_engine.hpp"

namespace {

using namespace accelerate;
namespace dist = accelerate::distributed;
using accelerate::testing::ThreadEngine;
using accelerate::testing::ThreadGroup;

// A failed expectation in a case: thrown, so that it works the same in a thread, in this
// process and in a worker process (where it becomes the exit code and the log).
#define CONFORM(condition, what)                                                                  \
  do {                                                                                            \
    if (!(condition))                                                                             \
      throw std::runtime_error(std::string(__FILE__ ":") + std::to_string(__LINE__) + ": rank " + \
                               std::to_string(engine.rank()) + ": " + (what) + " (" #condition ")"); \
  } while (false)

bool same(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && at::equal(a, b); }

// --- the cases -------------------------------------------------------------------------------

template <class E>
void ranks_and_devices(E& engine) {
  CONFORM(engine.world_size() >= 1, "a world of at least one process");
  CONFORM(engine.rank() >= 0 && engine.rank() < engine.world_size(), "rank within the world");
  CONFORM(engine.local_rank() >= 0 && engine.local_rank() < engine.local_world_size(), "local rank within the node");
  CONFORM(engine.local_world_size() <= engine.world_size(), "a node holds at most the world");
  CONFORM(E::distributed || engine.world_size() == 1, "an engine that talks to nobody has one process");
  const auto ranks = dist::gather_object(engine, engine.rank());
  CONFORM(static_cast<int>(ranks.size()) == engine.world_size(), "one answer per rank");
  for (int r = 0; r < engine.world_size(); ++r) CONFORM(ranks[static_cast<std::size_t>(r)] == r, "ranks in order");
}

template <class E>
void all_reduce_each_reduction(E& engine) {
  const int world = engine.world_size();
  const double value = engine.rank() + 1;
  auto reduced = [&](Reduction reduction) {
    at::Tensor t = at::full({3}, value, at::kDouble).to(engine.collective_device());
    engine.all_reduce(t, reduction);
    return t.cpu();
  };
  CONFORM(same(reduced(Reduction::sum), at::full({3}, world * (world + 1) / 2.0, at::kDouble)), "sum");
  CONFORM(same(reduced(Reduction::mean), at::full({3}, (world + 1) / 2.0, at::kDouble)), "mean");
  CONFORM(same(reduced(Reduction::max), at::full({3}, double(world), at::kDouble)), "max");
  CONFORM(same(reduced(Reduction::min), at::full({3}, 1.0, at::kDouble)), "min");
  at::Tensor integer = at::full({2}, engine.rank() * 2 + 1, at::kLong).to(engine.collective_device());
  engine.all_reduce(integer, Reduction::mean);  // integers: floor of the mean (world squared over world)
  CONFORM(integer.cpu()[0].item<std::int64_t>() == world, "integer mean");
}

template <class E>
void broadcast_and_all_gather(E& engine) {
  const int world = engine.world_size(), last = world - 1;
  at::Tensor t = at::full({2, 2}, float(engine.rank()), at::kFloat).to(engine.collective_device());
  engine.broadcast(t, last);
  CONFORM(same(t.cpu(), at::full({2, 2}, float(last))), "broadcast from the last rank");
  const at::Tensor mine = (at::arange(3, at::kLong) + 10 * engine.rank()).to(engine.collective_device());
  const auto parts = engine.all_gather(mine);
  CONFORM(static_cast<int>(parts.size()) == world, "all_gather: one part per rank");
  for (int r = 0; r < world; ++r)
    CONFORM(same(parts[static_cast<std::size_t>(r)].cpu(), at::arange(3, at::kLong) + 10 * r), "all_gather order");
}

template <class E>
void reduce_scatter_slices(E& engine) {
  const int world = engine.world_size(), rank = engine.rank();
  const at::Tensor input = (at::arange(world * 2 * 3, at::kFloat).reshape({world * 2, 3}) + rank).to(engine.collective_device());
  const at::Tensor sum = engine.reduce_scatter(input, Reduction::sum).cpu();
  const at::Tensor full_sum = at::arange(world * 2 * 3, at::kFloat).reshape({world * 2, 3}) * world +
                              world * (world - 1) / 2.0;
  CONFORM(same(sum, full_sum.narrow(0, 2 * rank, 2)), "reduce_scatter sum: this rank's slice of the sum");
  const at::Tensor mean = engine.reduce_scatter(input, Reduction::mean).cpu();
  CONFORM(at::allclose(mean, (full_sum / world).narrow(0, 2 * rank, 2)), "reduce_scatter mean");
  CONFORM(input.cpu().equal(at::arange(world * 2 * 3, at::kFloat).reshape({world * 2, 3}) + rank),
          "reduce_scatter leaves its input unchanged");
}

template <class E>
void barrier_and_stats(E& engine) {
  const CommStats before = engine.stats();
  engine.barrier();
  at::Tensor t = at::ones({4}, at::kFloat).to(engine.collective_device());
  engine.all_reduce(t, Reduction::sum);
  engine.broadcast(t, 0);
  (void)engine.all_gather(t);
  (void)engine.reduce_scatter(at::ones({engine.world_size() * 2}, at::kFloat).to(engine.collective_device()),
                              Reduction::sum);
  const CommStats after = engine.stats();
  if constexpr (E::distributed) {
    CONFORM(after.barrier.calls == before.barrier.calls + 1, "a barrier is counted");
    CONFORM(after.allreduce.calls == before.allreduce.calls + 1 && after.allreduce.bytes == before.allreduce.bytes + 16,
            "an all_reduce of 4 floats is counted as 16 bytes");
    CONFORM(after.broadcast.calls == before.broadcast.calls + 1, "a broadcast is counted");
    CONFORM(after.allgather.calls == before.allgather.calls + 1, "an all_gather is counted");
    CONFORM(after.reduce_scatter.calls == before.reduce_scatter.calls + 1 &&
                after.reduce_scatter.bytes == before.reduce_scatter.bytes + 8u * engine.world_size(),
            "a reduce_scatter is counted with its input's bytes");
  } else {
    CONFORM(after == CommStats{}, "an engine of one process moves nothing");
  }
}

template <class E>
void check_same_on_every_rank(E& engine) {
  engine.check_same_on_every_rank("conformance/same", "batch_size=4", "the same value");
  if (engine.world_size() == 1) return;
  std::string message = "no error";
  try {
    engine.check_same_on_every_rank("conformance/differs", engine.rank() == 1 ? "batch_size=5" : "batch_size=4",
                                    "loader");
  } catch (const accelerate::Error& e) {
    message = e.what();
  }
  CONFORM(message.find("loader") != std::string::npos, "a difference is an error on every rank: " + message);
}

template <class E>
void collectives_on_nested_containers(E& engine) {
  const int world = engine.world_size(), rank = engine.rank();
  const auto device = engine.collective_device();
  using Nested = std::tuple<at::Tensor, std::vector<at::Tensor>, std::map<std::string, at::Tensor>>;
  const Nested mine{at::full({1, 2}, float(rank), device),
                    {at::full({2}, float(rank), device), at::full({1}, float(10 + rank), device)},
                    {{"loss", at::full({1}, float(rank), device)}}};
  const Nested gathered = dist::gather(engine, mine);
  CONFORM(std::get<0>(gathered).size(0) == world, "gather: one row per rank");
  CONFORM(std::get<1>(gathered)[0].size(0) == 2 * world, "gather inside a vector");
  CONFORM(std::get<2>(gathered).at("loss").size(0) == world, "gather inside a map");
  for (int r = 0; r < world; ++r)
    CONFORM(std::get<1>(gathered)[1].cpu()[r].item<float>() == 10 + r, "gathered in rank order");
  const Nested summed = dist::reduce(engine, mine, Reduction::sum);
  CONFORM(std::get<2>(summed).at("loss").cpu().item<float>() == world * (world - 1) / 2.0f, "reduce inside a map");
  const Nested sent = dist::broadcast(engine, mine, world - 1);
  CONFORM(std::get<1>(sent)[1].cpu().item<float>() == 10 + world - 1, "broadcast inside a vector");
}

template <class E>
void uneven_sizes_padding_objects_and_splits(E& engine) {
  const int world = engine.world_size(), rank = engine.rank();
  const auto device = engine.collective_device();
  // Rank r holds r + 1 rows of r.
  const at::Tensor rows = at::full({rank + 1, 2}, float(rank), device);
  const at::Tensor all = dist::gather(engine, rows).cpu();
  CONFORM(all.size(0) == world * (world + 1) / 2, "uneven gather keeps every row");
  CONFORM(all[all.size(0) - 1][0].item<float>() == world - 1, "the last rows are the last rank's");
  const at::Tensor padded = dist::pad_across_processes(engine, rows, 0, -1.0, /*pad_first=*/true);
  CONFORM(padded.size(0) == world, "padded to the largest size");
  CONFORM(padded.cpu()[0][0].item<float>() == (rank + 1 == world ? float(rank) : -1.0f), "pad_first pads before");
  const auto names = dist::gather_object(engine, std::string("rank ") + std::to_string(rank));
  CONFORM(static_cast<int>(names.size()) == world && names.back() == "rank " + std::to_string(world - 1),
          "gather_object in rank order");
  const auto config = dist::broadcast_object(engine, std::map<std::string, int>{{"from", rank}}, world - 1);
  CONFORM(config.at("from") == world - 1, "broadcast_object from the last rank");
  std::vector<int> items(10);
  for (int i = 0; i < 10; ++i) items[static_cast<std::size_t>(i)] = i;
  std::vector<int> back;
  for (const auto& part : dist::gather_object(engine, dist::split_between_processes(engine, items)))
    back.insert(back.end(), part.begin(), part.end());
  CONFORM(back == items, "split_between_processes: every item once, in order");
}

template <class E>
void mismatches_are_errors_on_every_rank(E& engine) {
  if (engine.world_size() == 1) return;
  std::string message = "no error";
  try {
    (void)dist::reduce(engine, at::zeros({engine.rank() == 1 ? 4 : 3}, engine.collective_device()));
  } catch (const accelerate::Error& e) {
    message = e.what();
  }
  CONFORM(message.find("rank 0 passes") != std::string::npos && message.find("rank 1 passes") != std::string::npos,
          "a mismatched reduce names rank 0 and the differing rank: " + message);
  // The group is intact afterwards.
  const at::Tensor one = dist::reduce(engine, at::ones({1}, engine.collective_device()));
  CONFORM(one.cpu().item<float>() == engine.world_size(), "a matching collective after the error works");
}

// One list of the cases: typed tests below, and the Gloo workers, are made from it.
#define ACCELERATE_CONFORMANCE_CASES(X)                                  \
  X(RanksAndDevices, ranks_and_devices)                                  \
  X(AllReduceEachReduction, all_reduce_each_reduction)                   \
  X(BroadcastAndAllGather, broadcast_and_all_gather)                     \
  X(ReduceScatterSlices, reduce_scatter_slices)                          \
  X(BarrierAndStats, barrier_and_stats)                                  \
  X(CheckSameOnEveryRank, check_same_on_every_rank)                      \
  X(CollectivesOnNestedContainers, collectives_on_nested_containers)     \
  X(UnevenSizesPaddingObjectsAndSplits, uneven_sizes_padding_objects_and_splits) \
  X(MismatchesAreErrorsOnEveryRank, mismatches_are_errors_on_every_rank)

// --- harnesses: how each engine runs a case ----------------------------------------------------

struct LocalHarness {
  template <class Case>
  static void run(const std::string&, Case&& body) {
    dist::LocalEngine engine(AcceleratorOptions{}, "conformance");
    body(engine);
  }
};

struct ThreadHarness {
  template <class Case>
  static void run(const std::string&, Case&& body) {
    const auto errors = accelerate::testing::run_threads(3, [&](ThreadGroup& group, int rank) {
      ThreadEngine::Binding binding(group, rank);
      ThreadEngine engine(AcceleratorOptions{}, "conformance");
      body(engine);
    });
    for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "thread rank " << r;
  }
};

using GlooEngine = dist::ProcessGroupEngine<dist::GlooFactory>;
using Zero1Engine = dist::ShardedEngine<dist::GlooFactory, 1>;
using Zero2Engine = dist::ShardedEngine<dist::GlooFactory, 2>;
using Zero3Engine = dist::ShardedEngine<dist::GlooFactory, 3>;

// An engine over real processes: each case is a job of 3 ranks; `kind` tells the worker which
// engine to build.
template <class Engine>
struct ProcessHarness {
  template <class Case>
  static void run(const std::string& name, Case&&) {
    const auto job = accelerate::testing::run_job("conformance_" + name, {.world_size = 3, .args = {kind()}});
    EXPECT_EQ(job.exit_code, 0) << job.logs();
  }
  static std::string kind() {
    if constexpr (std::is_same_v<Engine, Zero1Engine>) return "zero1";
    else if constexpr (std::is_same_v<Engine, Zero2Engine>) return "zero2";
    else if constexpr (std::is_same_v<Engine, Zero3Engine>) return "zero3";
    else return "gloo";
  }
};
using GlooHarness = ProcessHarness<GlooEngine>;

template <class Engine, class Case>
int run_process_case(Case&& body) {
  Engine engine(AcceleratorOptions{.process_group = {.timeout = std::chrono::seconds(30)}}, "conformance");
  try {
    body(engine);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}

template <class Case>
int run_engine_case(Case&& body) {
  const char* args = std::getenv("ACCELERATE_TEST_ARGS");
  const std::string kind = args ? args : "gloo";
  if (kind == ProcessHarness<Zero1Engine>::kind()) return run_process_case<Zero1Engine>(body);
  if (kind == ProcessHarness<Zero2Engine>::kind()) return run_process_case<Zero2Engine>(body);
  if (kind == ProcessHarness<Zero3Engine>::kind()) return run_process_case<Zero3Engine>(body);
  return run_process_case<GlooEngine>(body);
}

#define ACCELERATE_CONFORMANCE_WORKER(Test, function) \
  ACCELERATE_WORKER(conformance_##function) {         \
    return run_engine_case([](auto& engine) { function(engine); }); \
  }
ACCELERATE_CONFORMANCE_CASES(ACCELERATE_CONFORMANCE_WORKER)

template <class Harness>
class BackendConformance : public ::testing::Test {};

// A new engine: its harness here.
using Harnesses = ::testing::Types<LocalHarness, ThreadHarness, GlooHarness, ProcessHarness<Zero1Engine>,
                                   ProcessHarness<Zero2Engine>, ProcessHarness<Zero3Engine>>;

struct HarnessNames {
  template <class T>
  static std::string GetName(int) {
    if constexpr (std::is_same_v<T, LocalHarness>) return "LocalEngine";
    else if constexpr (std::is_same_v<T, ThreadHarness>) return "ThreadEngine";
    else if constexpr (std::is_same_v<T, GlooHarness>) return "GlooEngine";
    else return "Zero" + T::kind().substr(4) + "GlooEngine";  // zero1 -> Zero1GlooEngine
  }
};
TYPED_TEST_SUITE(BackendConformance, Harnesses, HarnessNames);

#define ACCELERATE_CONFORMANCE_TEST(Test, function)                                     \
  TYPED_TEST(BackendConformance, Test) {                                                \
    TypeParam::run(#function, [](auto& engine) { function(engine); });                  \
  }
ACCELERATE_CONFORMANCE_CASES(ACCELERATE_CONFORMANCE_TEST)

static_assert(dist::BackendEngine<dist::LocalEngine>);
static_assert(dist::BackendEngine<GlooEngine>);
static_assert(dist::BackendEngine<Zero1Engine> && dist::BackendEngine<Zero2Engine> && dist::BackendEngine<Zero3Engine>);
static_assert(dist::BackendEngine<ThreadEngine>);

// --- the Accelerator over a fake engine ---------------------------------------------------------
// The Backend slot is the extension point: Accelerator<ThreadBackend> runs its collectives,
// check_trigger and a data-parallel step through ThreadEngine without knowing it.

TEST(FakeEngine, TheAcceleratorsCollectivesForwardToItsEngine) {
  const auto errors = accelerate::testing::run_threads(3, [](ThreadGroup& group, int rank) {
    ThreadEngine::Binding binding(group, rank);
    Accelerator<accelerate::testing::ThreadBackend> acc;
    auto& engine = acc.engine();
    if (acc.num_processes() != 3 || acc.process_index() != rank) throw std::runtime_error("rank or world");
    const at::Tensor gathered = acc.gather(at::full({rank + 1}, float(rank)));
    if (gathered.size(0) != 6) throw std::runtime_error("gather through the accelerator");
    if (acc.reduce(at::ones({2}), Reduction::sum).sum().item<float>() != 6) throw std::runtime_error("reduce");
    if (acc.broadcast_object(std::string(rank == 2 ? "two" : "other"), 2) != "two") throw std::runtime_error("broadcast_object");
    if (rank == 1) acc.set_trigger();
    if (!acc.check_trigger()) throw std::runtime_error("check_trigger on every rank");
    acc.wait_for_everyone();
    if (engine.stats().barrier.calls != 1 || acc.stats().barrier.calls != 1) throw std::runtime_error("stats");
  });
  for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(FakeEngine, AFailingRankFailsTheOthersInsteadOfHangingThem) {
  // The harness itself must not hang a test when a case goes wrong on one rank only.
  const auto errors = accelerate::testing::run_threads(2, [](ThreadGroup& group, int rank) {
    ThreadEngine::Binding binding(group, rank);
    ThreadEngine engine(AcceleratorOptions{}, "conformance");
    if (rank == 0) throw std::runtime_error("rank 0 gave up");
    engine.barrier();
  }, std::chrono::milliseconds(300));
  EXPECT_EQ(errors[0], "rank 0 gave up");
  EXPECT_NE(errors[1].find("did not reach the collective"), std::string::npos) << errors[1];
}

// --- customisation points ---------------------------------------------------------------------
// An engine that declares a hook replaces data parallel's default; the Accelerator calls it.

struct HookedEngine : dist::LocalEngine {
  using LocalEngine::LocalEngine;
  int steps = 0;
  int clips = 0;
  bool writer = false;

  template <class Optimizer>
  void step_optimizer(Optimizer& optimizer) {
    ++steps;
    optimizer.step();
  }
  double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm, double norm_type) {
    ++clips;
    return torch::nn::utils::clip_grad_norm_(params, max_norm, norm_type);
  }
  bool writes_replicated_state() const { return writer; }
};

struct HookedBackend {
  static constexpr std::string_view name = "HookedBackend";
  static constexpr std::string_view distributed_type = "NO";
  static constexpr bool is_distributed = false;
  static constexpr bool requires_cuda = false;
};

}  // namespace

template <>
struct accelerate::detail::backend_engine<HookedBackend> {
  using type = HookedEngine;
};

namespace {

// Prepares `net` and `sgd` with `acc` and runs one training step; returns the prepared model.
template <class Acc>
auto train_one_step(Acc& acc, torch::nn::Linear& net, torch::optim::SGD& sgd) {
  auto [model, opt] = acc.prepare(net, sgd);
  acc.backward(model(torch::ones({2, 3})).sum());
  opt.step();
  return model;
}

TEST(EngineHooks, TheAcceleratorCallsAnEnginesOwnStepClipAndWriterHooks) {
  Accelerator<HookedBackend, Fp32, NoAccumulation, ClipNorm<>> acc{{.cpu = true}};
  static_assert(std::is_same_v<decltype(acc)::engine_type, HookedEngine>);
  torch::nn::Linear net(3, 1);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto model = train_one_step(acc, net, sgd);
  EXPECT_EQ(acc.engine().steps, 1);
  EXPECT_EQ(acc.engine().clips, 1);
  acc.clip_grad_norm_(net->parameters(), 1.0);  // the public call goes through the hook too
  EXPECT_EQ(acc.engine().clips, 2);

  accelerate::testing::TempDir dir;
  acc.save_model(model, dir / "not_written");  // this rank does not write replicated state
  EXPECT_FALSE(std::filesystem::exists(dir / "not_written"));
  acc.engine().writer = true;
  acc.save_model(model, dir / "written");
  EXPECT_TRUE(std::filesystem::exists(dir / "written" / "model.safetensors"));
}

TEST(EngineHooks, AnEnginesOptimizerStepRunsEvenWhenNoPolicyActsOnTheStep) {
  // With no accumulation, scaling or clipping, the prepared optimizer could call the
  // optimizer directly; a sharded engine must still step its own shard.
  Accelerator<HookedBackend> acc{{.cpu = true}};
  torch::nn::Linear net(3, 1);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  train_one_step(acc, net, sgd);
  EXPECT_EQ(acc.engine().steps, 1);
  static_assert(!decltype(acc)::context_type::plain_optimizer_step);
  static_assert(accelerate::Accelerator<>::context_type::plain_optimizer_step);
}

TEST(EngineHooks, WithoutHooksTheDefaultsAreDataParallels) {
  dist::LocalEngine engine(AcceleratorOptions{}, "");
  EXPECT_TRUE(dist::writes_replicated_state(engine));  // rank 0 of 1
  torch::nn::Linear net(2, 2);
  for (auto& p : net->parameters()) p.mutable_grad() = torch::full_like(p, 3.0);
  const double norm = dist::clip_grad_norm(engine, net->parameters(), 1.0, 2.0);
  EXPECT_NEAR(norm, std::sqrt(6.0 * 9.0), 1e-5);  // 6 float gradient elements of 3
  const auto state = dist::full_model_state(engine, *net);
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "weight");
  EXPECT_EQ(state[1].first, "bias");
}

}  // namespace
