// The conformance suite over every engine that runs on a CPU: the cases of
// tests/support/engine_conformance.hpp, each run by the harness of each engine. A new engine
// proves itself by adding its harness to `Harnesses`.
//   LocalEngine         in-process, world size 1
//   ThreadEngine        the fake engine of tests/support, 3 threads of this process
//   Gloo engine         3 real processes (TCPStore and ProcessGroupGloo on 127.0.0.1), and 1
//   Zero stages 1-3     the sharded engines over Gloo, 3 real processes, and 1
// NCCL's engines (plain and Zero stages 1-3) run the same cases from tests/gpu/nccl_train.cpp,
// one process per GPU (CTest's gpu.nccl_conformance_*).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <torch/torch.h>

#include <accelerate/accelerate.hpp>
#include <accelerate/distributed/collectives.hpp>
#include <accelerate/distributed/engine.hpp>
#include <accelerate/distributed/local_engine.hpp>
#include <accelerate/distributed/sharded.hpp>

#include "../support/engine_conformance.hpp"
#include "../support/multiprocess.hpp"
#include "../support/temp_dir.hpp"
#include "../support/thread_engine.hpp"

namespace {

using namespace accelerate;
namespace dist = accelerate::distributed;
using accelerate::testing::ThreadEngine;
using accelerate::testing::ThreadGroup;
using namespace accelerate::testing::conformance;

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

// An engine over real processes: each case is a job of `World` ranks; `kind` tells the worker
// which engine to build. World 1 is what NCCL's runs do on a machine with one GPU.
template <class Engine, int World = 3>
struct ProcessHarness {
  template <class Case>
  static void run(const std::string& name, Case&&) {
    const auto job = accelerate::testing::run_job("conformance_" + name, {.world_size = World, .args = {kind()}});
    EXPECT_EQ(job.exit_code, 0) << job.logs();
  }
  static std::string kind() {
    if constexpr (std::is_same_v<Engine, Zero1Engine>) return "zero1";
    else if constexpr (std::is_same_v<Engine, Zero2Engine>) return "zero2";
    else if constexpr (std::is_same_v<Engine, Zero3Engine>) return "zero3";
    else return "gloo";
  }
  static std::string name() {
    // zero1 -> Zero1GlooEngine; a world other than 3 in the name: Zero1GlooEngineWorld1
    const std::string engine = kind() == "gloo" ? "GlooEngine" : "Zero" + kind().substr(4) + "GlooEngine";
    return World == 3 ? engine : engine + "World" + std::to_string(World);
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
                                   ProcessHarness<Zero2Engine>, ProcessHarness<Zero3Engine>,
                                   ProcessHarness<GlooEngine, 1>, ProcessHarness<Zero1Engine, 1>,
                                   ProcessHarness<Zero2Engine, 1>, ProcessHarness<Zero3Engine, 1>>;

struct HarnessNames {
  template <class T>
  static std::string GetName(int) {
    if constexpr (std::is_same_v<T, LocalHarness>) return "LocalEngine";
    else if constexpr (std::is_same_v<T, ThreadHarness>) return "ThreadEngine";
    else return T::name();
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
