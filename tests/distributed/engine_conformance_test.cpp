// The conformance suite over every engine that runs on a CPU, registered once in `Registered`
// below: the engine cases of tests/support/engine_conformance.hpp, each run by every registered
// engine, and the training laws of tests/support/training_laws.hpp, run through
// Accelerator<Backend> by every registered engine that synchronises gradients.
//   LocalEngine         in-process, world size 1
//   ThreadEngine        the fake engine of tests/support, 3 threads of this process
//   Gloo engine         3 real processes (TCPStore and ProcessGroupGloo on 127.0.0.1), and 1
//   Zero stages 1-3     the sharded engines over Gloo, 3 real processes, and 1
// NCCL's engines (plain and Zero stages 1-3) run the same engine cases from
// tests/gpu/nccl_train.cpp, one process per GPU (CTest's gpu.nccl_conformance_*).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <tuple>
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
#include "../support/training_laws.hpp"

namespace {

using namespace accelerate;
namespace dist = accelerate::distributed;
using accelerate::testing::ThreadEngine;
using accelerate::testing::ThreadGroup;
using namespace accelerate::testing::conformance;
using namespace accelerate::testing::laws;

// --- the registration ---------------------------------------------------------------------------

// An engine's name in test names and in its workers' arguments.
struct EngineName {
  template <std::size_t N>
  constexpr EngineName(const char (&name)[N]) {  // NOLINT: implicit, for Register<_, "Name">
    static_assert(N <= sizeof(text), "EngineName: a shorter name");
    std::copy_n(name, N, text);
  }
  char text[32] = {};
};

// One engine: its Backend policy (the engine is the one Accelerator<Backend> uses), its name, and
// the world sizes it runs at (the first one's tests carry the bare name, the others "World<n>").
template <class Backend, EngineName Name, int... Worlds>
struct Register {};

// Every engine of the suite, one line each.
using Registered = std::tuple<Register<SingleProcess, "LocalEngine", 1>,
                              Register<accelerate::testing::ThreadBackend, "ThreadEngine", 3>,
                              Register<Gloo, "GlooEngine", 3, 1>,
                              Register<Zero<Gloo, 1>, "Zero1GlooEngine", 3, 1>,
                              Register<Zero<Gloo, 2>, "Zero2GlooEngine", 3, 1>,
                              Register<Zero<Gloo, 3>, "Zero3GlooEngine", 3, 1>>;

// --- harnesses: how each registered engine runs a case --------------------------------------------

enum class RunsOn { this_thread, threads, processes };

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

template <class Law>
int run_process_law(Law&& law) {
  try {
    law(accelerate::testing::job_dir());
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}

template <class B, EngineName Name, int World, bool First>
struct Harness {
  using Backend = B;
  using Engine = typename accelerate::detail::backend_engine<Backend>::type;
  static constexpr RunsOn runs_on = std::is_same_v<Backend, SingleProcess>                         ? RunsOn::this_thread
                                    : std::is_same_v<Backend, accelerate::testing::ThreadBackend> ? RunsOn::threads
                                                                                                   : RunsOn::processes;
  // ThreadEngine fakes the collectives only: it has no gradient synchronisation to train with.
  static constexpr bool trains = runs_on != RunsOn::threads;

  static std::string id() { return Name.text; }
  static std::string name() { return First ? id() : id() + "World" + std::to_string(World); }

  // Runs engine case `body` (named `case_name`, whose worker is conformance_<case_name>).
  template <class Case>
  static void run(const std::string& case_name, Case&& body) {
    if constexpr (runs_on == RunsOn::this_thread) {
      Engine engine(AcceleratorOptions{}, "conformance");
      body(engine);
    } else if constexpr (runs_on == RunsOn::threads) {
      const auto errors = accelerate::testing::run_threads(World, [&](ThreadGroup& group, int rank) {
        ThreadEngine::Binding binding(group, rank);
        Engine engine(AcceleratorOptions{}, "conformance");
        body(engine);
      });
      for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "thread rank " << r;
    } else {
      const auto job = accelerate::testing::run_job("conformance_" + case_name, {.world_size = World, .args = {id()}});
      EXPECT_EQ(job.exit_code, 0) << job.logs();
    }
  }

  // Runs training law `law` (worker law_<law_name>), given a folder every rank shares.
  template <class Law>
  static void run_law(const std::string& law_name, Law&& law) {
    if constexpr (runs_on == RunsOn::this_thread) {
      accelerate::testing::TempDir dir;
      law(dir.path());
    } else {
      const auto job = accelerate::testing::run_job("law_" + law_name, {.world_size = World, .args = {id()}});
      EXPECT_EQ(job.exit_code, 0) << job.logs();
    }
  }
};

// Register<...> -> one Harness per world size.
template <class R>
struct harnesses_of;
template <class B, EngineName Name, int First, int... Others>
struct harnesses_of<Register<B, Name, First, Others...>> {
  using type = std::tuple<Harness<B, Name, First, true>, Harness<B, Name, Others, false>...>;
};
template <class List>
struct all_harnesses;
template <class... R>
struct all_harnesses<std::tuple<R...>> {
  using type = decltype(std::tuple_cat(std::declval<typename harnesses_of<R>::type>()...));
};
using Harnesses = typename all_harnesses<Registered>::type;

// The harnesses whose engines train (ThreadEngine left out).
template <class List>
struct training;
template <class... H>
struct training<std::tuple<H...>> {
  using type = decltype(std::tuple_cat(std::declval<std::conditional_t<H::trains, std::tuple<H>, std::tuple<>>>()...));
};

template <class List>
struct gtest_types;
template <class... H>
struct gtest_types<std::tuple<H...>> {
  using type = ::testing::Types<H...>;
};

// In a worker process: runs `run(harness)` with the registered harness its argument names.
template <class Run>
int for_worker_engine(Run&& run) {
  const std::string id = accelerate::testing::worker_arguments().at(0);
  int result = -1;
  std::apply(
      [&](auto... harness) {
        ((result < 0 && decltype(harness)::runs_on == RunsOn::processes && decltype(harness)::id() == id
              ? void(result = run(harness))
              : void()),
         ...);
      },
      Harnesses{});
  if (result < 0) std::cerr << "no registered engine runs in processes as '" << id << "'\n";
  return result < 0 ? 2 : result;
}

#define ACCELERATE_CONFORMANCE_WORKER(Test, function)                                                 \
  ACCELERATE_WORKER(conformance_##function) {                                                        \
    return for_worker_engine([](auto harness) {                                                      \
      if constexpr (decltype(harness)::runs_on == RunsOn::processes)                                 \
        return run_process_case<typename decltype(harness)::Engine>([](auto& engine) { function(engine); }); \
      else                                                                                           \
        return 2;                                                                                    \
    });                                                                                              \
  }
ACCELERATE_CONFORMANCE_CASES(ACCELERATE_CONFORMANCE_WORKER)

#define ACCELERATE_LAW_WORKER(Test, function)                                                         \
  ACCELERATE_WORKER(law_##function) {                                                                \
    return for_worker_engine([](auto harness) {                                                      \
      using H = decltype(harness);                                                                   \
      if constexpr (H::trains && H::runs_on == RunsOn::processes)                                    \
        return run_process_law([](const std::filesystem::path& dir) { function<typename H::Backend>(dir); }); \
      else                                                                                           \
        return 2;                                                                                    \
    });                                                                                              \
  }
ACCELERATE_TRAINING_LAWS(ACCELERATE_LAW_WORKER)

struct HarnessNames {
  template <class T>
  static std::string GetName(int) {
    return T::name();
  }
};

template <class Harness>
class BackendConformance : public ::testing::Test {};
TYPED_TEST_SUITE(BackendConformance, typename gtest_types<Harnesses>::type, HarnessNames);

#define ACCELERATE_CONFORMANCE_TEST(Test, function)                                     \
  TYPED_TEST(BackendConformance, Test) {                                                \
    TypeParam::run(#function, [](auto& engine) { function(engine); });                  \
  }
ACCELERATE_CONFORMANCE_CASES(ACCELERATE_CONFORMANCE_TEST)

template <class Harness>
class TrainingLaws : public ::testing::Test {};
TYPED_TEST_SUITE(TrainingLaws, typename gtest_types<typename training<Harnesses>::type>::type, HarnessNames);

#define ACCELERATE_LAW_TEST(Test, function)                                                              \
  TYPED_TEST(TrainingLaws, Test) {                                                                       \
    TypeParam::run_law(#function,                                                                        \
                       [](const std::filesystem::path& dir) { function<typename TypeParam::Backend>(dir); }); \
  }
ACCELERATE_TRAINING_LAWS(ACCELERATE_LAW_TEST)

using GlooEngine = dist::ProcessGroupEngine<dist::GlooFactory>;
using Zero1Engine = dist::ShardedEngine<dist::GlooFactory, 1>;
using Zero2Engine = dist::ShardedEngine<dist::GlooFactory, 2>;
using Zero3Engine = dist::ShardedEngine<dist::GlooFactory, 3>;

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
