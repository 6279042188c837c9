// Tests of include/accelerate/accelerator.hpp: accessors, prepare() dispatch and order, device
// placement, and the single-process loop against a hand-written LibTorch loop.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "../support/models.hpp"
#include "../support/temp_dir.hpp"

namespace {

using accelerate::testing::TempDir;
using accelerate::testing::TinyNet;
using accelerate::testing::flat_parameters;
using accelerate::testing::regression_data;

TEST(Accelerator, ProcessHelpersRunOnTheProcessTheyName) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  int ran = 0;
  EXPECT_TRUE(acc.on_last_process([&] { ++ran; }));  // the only process is the last
  EXPECT_TRUE(acc.on_local_process(0, [&] { ++ran; }));
  EXPECT_FALSE(acc.on_local_process(1, [&] { ++ran; }));
  EXPECT_FALSE(acc.on_process(1, [&] { ++ran; }));
  EXPECT_EQ(ran, 2);
  {
    auto first = acc.local_main_process_first();
    ++ran;
  }
  EXPECT_EQ(ran, 3);
}

// Accelerate's dict case: every value split at the same positions.
#if defined(__GLIBC__)
// Builds an Accelerator with `retain`, frees a 16 MB buffer, then exits with 0 when a fresh
// 8 MB buffer is mmapped (glibc hands it back to the system when freed), 1 when it comes from
// the heap (kept). The 16 MB buffer is what makes glibc's own default keep the 8 MB one: freeing
// an mmapped buffer raises its mmap threshold to that buffer's size.
[[noreturn]] void exit_with_where_an_8_mb_buffer_lives(std::optional<bool> retain) {
  { accelerate::Accelerator<> acc{{.cpu = true, .retain_freed_memory = retain}}; }
  void* (*volatile allocate)(std::size_t) = std::malloc;  // not elided with its free
  std::free(allocate(16u << 20));
  const std::size_t before = mallinfo2().hblkhd;
  void* buffer = allocate(8u << 20);
  const bool mmapped = mallinfo2().hblkhd >= before + (8u << 20);
  std::free(buffer);
  std::exit(mmapped ? 0 : 1);
}
#endif

TEST(RetainFreedMemory, TrueKeepsBuffersInTheHeapFalseHandsThemBack) {
#if defined(__GLIBC__)
  // Each case in a fresh process: what earlier tests freed would serve the buffer from the heap.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(exit_with_where_an_8_mb_buffer_lives(std::nullopt), testing::ExitedWithCode(1), "")
      << "one process, unset: kept";
  EXPECT_EXIT(exit_with_where_an_8_mb_buffer_lives(true), testing::ExitedWithCode(1), "");
  EXPECT_EXIT(exit_with_where_an_8_mb_buffer_lives(false), testing::ExitedWithCode(0), "");
#else
  GTEST_SKIP() << "the C library is not glibc: retain_freed_memory changes nothing";
#endif
}

#if defined(__linux__) && !defined(__ANDROID__)
enum class Before { nothing, report, tensor };

// In a fresh process: THP_MEM_ALLOC_ENABLE set to `variable` (nullptr: unset), then `before`,
// then an Accelerator with `huge_pages`; exits with 0 when LibTorch backs large CPU buffers
// with huge pages (it then aligns them to the page), 1 when not.
[[noreturn]] void exit_with_whether_large_buffers_use_huge_pages(const char* variable, bool huge_pages,
                                                                 Before before = Before::nothing) {
  if (variable != nullptr) ::setenv("THP_MEM_ALLOC_ENABLE", variable, 1);
  else ::unsetenv("THP_MEM_ALLOC_ENABLE");
  if (before == Before::report) (void)accelerate::environment_report();
  if (before == Before::tensor) (void)torch::zeros({4});
  { accelerate::Accelerator<> acc{{.cpu = true, .huge_pages = huge_pages}}; }
  const torch::Tensor buffer = torch::empty({1 << 20});  // 4 MB
  const auto on = accelerate::compat::cpu_huge_pages();
  const bool page_aligned = reinterpret_cast<std::uintptr_t>(buffer.data_ptr()) % 4096 == 0;
  std::exit(on.value_or(page_aligned) && page_aligned ? 0 : 1);
}
#endif

TEST(HugePages, OnUnlessTheOptionOrTheEnvironmentSaysOtherwise) {
#if defined(__linux__) && !defined(__ANDROID__)
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // each case in a fresh process
  EXPECT_EXIT(exit_with_whether_large_buffers_use_huge_pages(nullptr, true), testing::ExitedWithCode(0), "");
  EXPECT_EXIT(exit_with_whether_large_buffers_use_huge_pages(nullptr, false), testing::ExitedWithCode(1), "");
  EXPECT_EXIT(exit_with_whether_large_buffers_use_huge_pages("0", true), testing::ExitedWithCode(1), "")
      << "the environment's 0 wins over the default";
  EXPECT_EXIT(exit_with_whether_large_buffers_use_huge_pages("1", false), testing::ExitedWithCode(0), "")
      << "false leaves the environment's choice";
  EXPECT_EXIT(exit_with_whether_large_buffers_use_huge_pages(nullptr, true, Before::report), testing::ExitedWithCode(0), "")
      << "a report printed first must not fix LibTorch's choice";
  EXPECT_EXIT(exit_with_whether_large_buffers_use_huge_pages(nullptr, true, Before::tensor), testing::ExitedWithCode(1), "")
      << "LibTorch reads the variable at the first CPU allocation: too late after a tensor";
#else
  GTEST_SKIP() << "LibTorch's huge pages are a Linux feature";
#endif
}

// Unset, the Backend policy decides: sharded backends hand freed buffers back.
static_assert(accelerate::detail::retains_freed_memory_by_default<accelerate::SingleProcess>);
static_assert(accelerate::detail::retains_freed_memory_by_default<accelerate::Gloo>);
static_assert(!accelerate::detail::retains_freed_memory_by_default<accelerate::Zero<accelerate::Gloo, 1>>);
static_assert(!accelerate::detail::retains_freed_memory_by_default<accelerate::Zero<accelerate::Nccl, 3>>);

TEST(SplitBetweenProcesses, SplitsEveryValueOfAMapAlike) {
  const std::map<std::string, std::vector<int>> inputs{{"a", {1, 2, 3, 4, 5}}, {"b", {6, 7, 8, 9, 10}}};
  using accelerate::distributed::split_between_processes;
  EXPECT_EQ(split_between_processes(inputs, 0, 2), (std::map<std::string, std::vector<int>>{{"a", {1, 2, 3}}, {"b", {6, 7, 8}}}));
  EXPECT_EQ(split_between_processes(inputs, 1, 2), (std::map<std::string, std::vector<int>>{{"a", {4, 5}}, {"b", {9, 10}}}));
  EXPECT_EQ(split_between_processes(inputs, 1, 2, /*apply_padding=*/true),
            (std::map<std::string, std::vector<int>>{{"a", {4, 5, 5}}, {"b", {9, 10, 10}}}));
  const std::map<std::string, torch::Tensor> tensors{{"x", torch::arange(6).view({3, 2})}, {"y", torch::arange(3)}};
  const auto part = split_between_processes(tensors, 1, 2);
  EXPECT_TRUE(torch::equal(part.at("x"), torch::tensor({{4, 5}})));
  EXPECT_TRUE(torch::equal(part.at("y"), torch::tensor({2})));
  const std::map<std::string, std::vector<int>> uneven{{"a", {1, 2, 3}}, {"b", {4, 5}}};
  try {
    split_between_processes(uneven, 0, 2);
    ADD_FAILURE() << "values of different lengths were split";
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'a' has 3 and 'b' 2"), std::string::npos) << e.what();
  }
}

TEST(Accelerator, GetStateDictAndSaveWriteTheUnwrappedModel) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  TinyNet net;
  auto [model] = acc.prepare(net);
  const auto state = acc.get_state_dict(model);
  ASSERT_EQ(state.size(), 4u);
  EXPECT_TRUE(torch::equal(state.at("fc1.weight"), net->fc1->weight));
  EXPECT_FALSE(state.at("fc1.weight").requires_grad());
  accelerate::testing::TempDir dir;
  const auto path = dir.path() / "weights.safetensors";
  EXPECT_TRUE(acc.save(state, path));
  const auto file = accelerate::checkpoint::SafetensorsFile::open(path);
  const auto loaded = file.tensors();
  ASSERT_EQ(loaded.size(), 4u);
  for (const auto& [name, tensor] : state) EXPECT_TRUE(torch::equal(loaded.at(name), tensor)) << name;
  // Nothing is left beside it (the temporary was renamed).
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()), 1);
}

TEST(Accelerator, DefaultIsOneCpuProcess) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  EXPECT_EQ(acc.device(), torch::Device(torch::kCPU));
  EXPECT_EQ(acc.process_index(), 0);
  EXPECT_EQ(acc.local_process_index(), 0);
  EXPECT_EQ(acc.num_processes(), 1);
  EXPECT_TRUE(acc.is_main_process());
  EXPECT_TRUE(acc.is_local_main_process());
  EXPECT_EQ(acc.distributed_type(), "NO");
  EXPECT_EQ(acc.mixed_precision(), "no");
  EXPECT_EQ(acc.gradient_accumulation_steps(), 1u);
  acc.wait_for_everyone();  // a no-op with one process
  EXPECT_EQ(acc.stats(), accelerate::CommStats{});
}

TEST(Accelerator, PrintWritesSpaceSeparatedOnMain) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  std::ostringstream captured;
  auto* old = std::cout.rdbuf(captured.rdbuf());
  acc.print("loss", 1.5, 3);
  std::cout.rdbuf(old);
  EXPECT_EQ(captured.str(), "loss 1.5 3\n");
}

TEST(Accelerator, InvalidOptionsNameTheField) {
  using Acc = accelerate::Accelerator<>;
  auto message = [](accelerate::AcceleratorOptions o) {
    try {
      Acc acc{o};
    } catch (const accelerate::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({.clip = {.max_norm = -1.0}}).find("AcceleratorOptions::clip.max_norm"), std::string::npos);
  EXPECT_NE(message({.precision = {.grad_scaler = {.backoff_factor = 2.0}}}).find("precision.grad_scaler.backoff_factor"),
            std::string::npos);
  EXPECT_NE(message({.accumulation = {.num_steps = 4}}).find("accumulation.num_steps is 4"),
            std::string::npos);
  EXPECT_NE(message({.project = {.automatic_checkpoint_naming = true}}).find("project_dir"),
            std::string::npos);
  // PowerSGD's state needs two uncompressed rounds first, as torch's hook says.
  accelerate::AcceleratorOptions power_sgd;
  power_sgd.ddp.compression = accelerate::GradientCompression::power_sgd;
  power_sgd.ddp.power_sgd.start_iteration = 1;
  EXPECT_NE(message(power_sgd).find("power_sgd.start_iteration must be > 1"), std::string::npos) << message(power_sgd);
  power_sgd.ddp.power_sgd.error_feedback = power_sgd.ddp.power_sgd.warm_start = false;
  EXPECT_EQ(message(power_sgd), "no error");
}

TEST(Accelerator, PrepareReturnsTypedWrappersInOrder) {
  using Acc = accelerate::Accelerator<>;
  Acc acc{{.cpu = true}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  torch::optim::StepLR lr(sgd, 2, 0.5);
  auto data = accelerate::DataLoader(regression_data(32), {.batch_size = 8});
  auto [loader, model, opt, sched] = acc.prepare(data, net, sgd, lr);

  static_assert(std::is_same_v<decltype(model), accelerate::PreparedModel<TinyNet, Acc>>);
  static_assert(std::is_same_v<decltype(opt), accelerate::PreparedOptimizer<torch::optim::SGD, Acc>>);
  static_assert(std::is_same_v<decltype(sched), accelerate::PreparedScheduler<torch::optim::StepLR, Acc>>);
  using Loader = std::remove_cvref_t<decltype(loader)>;
  static_assert(std::is_same_v<Loader::batch_type, torch::data::Example<torch::Tensor, torch::Tensor>>);

  // Lvalues are referred to, not copied.
  EXPECT_EQ(&opt.unwrap(), &sgd);
  EXPECT_EQ(&sched.unwrap(), &lr);
  EXPECT_EQ(model.unwrap().get(), net.get());
  EXPECT_EQ(acc.unwrap_model(model).get(), net.get());
  EXPECT_EQ(loader.size(), 4u);

  // The checkpoint registry follows argument order.
  using Kind = accelerate::detail::CheckpointEntry::Kind;
  ASSERT_EQ(acc.checkpoint_entries().size(), 4u);
  EXPECT_EQ(acc.checkpoint_entries()[0].kind, Kind::dataloader);
  EXPECT_EQ(acc.checkpoint_entries()[1].kind, Kind::model);
  EXPECT_EQ(acc.checkpoint_entries()[2].kind, Kind::optimizer);
  EXPECT_EQ(acc.checkpoint_entries()[3].kind, Kind::scheduler);
}

TEST(Accelerator, PrepareTakesOwnershipOfRvaluesAndSmartPointers) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto net = std::make_shared<accelerate::testing::TinyNetImpl>();
  auto [model, opt, loader] =
      acc.prepare(net, std::make_unique<torch::optim::Adam>(net->parameters()),
                  std::vector<torch::Tensor>{torch::ones({2, 8}), torch::zeros({2, 8})});
  EXPECT_EQ(model.unwrap().get(), net.get());
  opt.zero_grad();
  model(torch::ones({2, 8})).sum().backward();
  opt.step();
  EXPECT_EQ(opt->state().size(), net->parameters().size());
  int batches = 0;
  for (auto& batch : loader) {
    EXPECT_EQ(batch.sizes(), torch::IntArrayRef({2, 8}));
    ++batches;
  }
  EXPECT_EQ(batches, 2);
}

TEST(Accelerator, ModelAndBatchesAreOnTheDevice) {
  accelerate::Accelerator<> acc;  // CUDA when visible, else CPU
  TinyNet net;
  auto [model, loader] = acc.prepare(net, accelerate::DataLoader(regression_data(10), {.batch_size = 4}));
  for (const auto& p : model->parameters()) EXPECT_EQ(p.device(), acc.device());
  std::vector<int64_t> rows;
  for (auto& [x, y] : loader) {
    EXPECT_EQ(x.device(), acc.device());
    EXPECT_EQ(y.device(), acc.device());
    rows.push_back(x.size(0));
  }
  EXPECT_EQ(rows, (std::vector<int64_t>{4, 4, 2}));  // one process: a short last batch
}

// The acceptance test of the policy core: 20 steps through Accelerator<> equal, bit for bit,
// the same loop written by hand in LibTorch.
TEST(Accelerator, SingleProcessLoopEqualsHandWrittenLoopBitForBit) {
  const auto dataset = regression_data(20 * 16);
  auto train_by_hand = [&] {
    torch::manual_seed(7);
    TinyNet net;
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::StepLR lr(opt, 5, 0.5);
    for (int64_t step = 0; step < 20; ++step) {
      auto x = dataset.inputs().narrow(0, step * 16, 16);
      auto y = dataset.targets().narrow(0, step * 16, 16);
      opt.zero_grad();
      torch::mse_loss(net(x), y).backward();
      opt.step();
      lr.step();
    }
    return flat_parameters(*net);
  };
  auto train_with_accelerator = [&] {
    accelerate::Accelerator<> acc{{.cpu = true, .seed = 7}};
    TinyNet net;
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::StepLR lr(sgd, 5, 0.5);
    auto [model, opt, sched, loader] =
        acc.prepare(net, sgd, lr, accelerate::DataLoader(dataset, {.batch_size = 16}));
    int steps = 0;
    for (auto& [x, y] : loader) {
      auto step = acc.accumulate(model);
      opt.zero_grad();
      acc.backward(torch::mse_loss(model(x), y));
      opt.step();
      sched.step();
      ++steps;
    }
    EXPECT_EQ(steps, 20);
    return flat_parameters(*net);
  };
  const auto expected = train_by_hand();
  const auto actual = train_with_accelerator();
  EXPECT_TRUE(torch::equal(expected, actual)) << (expected - actual).abs().max();
}

TEST(Accelerator, SetSeedMakesRunsRepeatable) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  acc.set_seed(3);
  auto a = torch::randn({4});
  acc.set_seed(3);
  auto b = torch::randn({4});
  EXPECT_TRUE(torch::equal(a, b));
}

TEST(Accelerator, CollectivesAreIdentitiesWithOneProcess) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto t = torch::arange(6).reshape({3, 2});
  EXPECT_TRUE(torch::equal(acc.gather(t), t));
  EXPECT_TRUE(torch::equal(acc.reduce(t, accelerate::Reduction::mean), t));
  EXPECT_TRUE(torch::equal(acc.broadcast(t), t));
  EXPECT_TRUE(torch::equal(acc.pad_across_processes(t), t));
  std::vector<int> items{1, 2, 3};
  EXPECT_EQ(acc.split_between_processes(items), items);
  EXPECT_TRUE(acc.on_main_process([] {}));
  { auto first = acc.main_process_first(); }
}

TEST(Prepare, AnAlreadyPreparedObjectComesBackUnchanged) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  torch::optim::StepLR lr(sgd, 1, 0.5);
  auto [model, opt, sched, loader] =
      acc.prepare(net, sgd, lr, accelerate::DataLoader(regression_data(12), {.batch_size = 4}));
  const auto registered = acc.checkpoint_entries().size();
  auto [model2, opt2, sched2, loader2] = acc.prepare(model, opt, sched, loader);
  static_assert(std::is_same_v<decltype(model2), decltype(model)>);
  static_assert(std::is_same_v<decltype(opt2), decltype(opt)>);
  static_assert(std::is_same_v<decltype(sched2), decltype(sched)>);
  static_assert(std::is_same_v<decltype(loader2), decltype(loader)>, "a prepared loader is not sharded again");
  EXPECT_EQ(acc.checkpoint_entries().size(), registered) << "nothing is registered twice";
  EXPECT_EQ(&*model2, &*model);
  std::size_t batches = 0;
  for (auto& batch : loader2) {
    (void)batch;
    ++batches;
  }
  EXPECT_EQ(batches, 3u);
  EXPECT_EQ(loader.epoch(), 1u) << "the copy shares the original's position";
}


// A Precision policy with a forward side and a checkpoint file of its own (the shape an Fp8
// policy would take): a tag, a step-state specialisation, and the accelerator uses both.
struct TracedPrecision {
  static constexpr std::string_view name = "traced";
  static constexpr bool autocast = false;
  static constexpr c10::ScalarType dtype = c10::ScalarType::Float;
};

int traced_scopes_open = 0;
struct TracedForwardScope {
  explicit TracedForwardScope(c10::DeviceType) { ++traced_scopes_open; }
  ~TracedForwardScope() { --traced_scopes_open; }
  TracedForwardScope(const TracedForwardScope&) = delete;
  TracedForwardScope& operator=(const TracedForwardScope&) = delete;
};

}  // namespace

template <>
class accelerate::step::PrecisionStep<TracedPrecision> : public accelerate::step::PrecisionStep<accelerate::Fp32> {
 public:
  using accelerate::step::PrecisionStep<accelerate::Fp32>::PrecisionStep;
  static constexpr bool wraps_forward = true;
  using ForwardScope = TracedForwardScope;
  static at::Tensor forward_output(at::Tensor output, const accelerate::PrecisionOptions&) { return output * 2; }
  static void register_state(accelerate::checkpoint::Registry& registry) {
    registry.add({.kind = accelerate::checkpoint::Entry::Kind::precision,
                  .owner = accelerate::checkpoint::EntryOwner::main_rank,
                  .save =
                      [] {
                        accelerate::StateDict state;
                        state.values["scopes_open"] = traced_scopes_open;
                        return state;
                      },
                  .load = [](const accelerate::StateDict&) {},
                  .stem = "traced_meta"});
  }
};

namespace {

// Records how many forward scopes were open while it ran.
struct ScopeProbeImpl : torch::nn::Module {
  ScopeProbeImpl() : linear(register_module("linear", torch::nn::Linear(3, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    open_during_forward = traced_scopes_open;
    return linear(x);
  }
  torch::nn::Linear linear;
  int open_during_forward = -1;
};
TORCH_MODULE(ScopeProbe);

TEST(PreparedModel, RunsForwardUnderThePrecisionStepsScopeAndHandsBackItsOutput) {
  accelerate::Accelerator<accelerate::SingleProcess, TracedPrecision> acc;
  ScopeProbe net;
  auto [model] = acc.prepare(net);
  const auto x = torch::randn({4, 3});
  const auto out = model(x);
  EXPECT_EQ(net->open_during_forward, 1);
  EXPECT_EQ(traced_scopes_open, 0) << "closed after forward";
  EXPECT_TRUE(torch::equal(out, net->linear(x) * 2));
}

TEST(SaveState, APrecisionPolicyNamesItsOwnFile) {
  TempDir dir;
  accelerate::Accelerator<accelerate::SingleProcess, TracedPrecision> acc;
  acc.save_state(dir.path() / "checkpoint");
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "checkpoint" / "traced_meta.json"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "checkpoint" / "scaler.json"));
}

}  // namespace

namespace {

// A NaN or infinite loss: with check_finite_loss, backward() refuses it naming the call, before
// autograd touches a gradient; without it, the NaN reaches the parameters (what the check is for).
template <class Acc>
void expect_nonfinite_loss_refused() {
  Acc acc{{.cpu = true, .seed = 1, .check_finite_loss = true}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, opt] = acc.prepare(net, sgd);
  const auto data = regression_data(8);
  auto loss = [&](double factor) { return torch::mse_loss(model(data.inputs()), data.targets()) * factor; };
  for (int i = 0; i < 2; ++i) {
    auto step = acc.accumulate(model);
    acc.backward(loss(1.0));
    opt.step();
    opt.zero_grad();
  }
  const auto before = flat_parameters(*net);
  for (const double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
    auto step = acc.accumulate(model);
    std::string message = "no error";
    try {
      acc.backward(loss(bad));
    } catch (const accelerate::Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("backward: the loss is"), std::string::npos) << message;
    EXPECT_NE(message.find(std::isnan(bad) ? "nan" : "inf"), std::string::npos) << message;
    EXPECT_NE(message.find(std::isnan(bad) ? "backward call 3 " : "backward call 4 "), std::string::npos) << message;
    EXPECT_NE(message.find("on rank 0 of 1"), std::string::npos) << message;
    for (const auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined() && p.grad().abs().sum().item<double>() != 0);
    opt.step();
  }
  EXPECT_TRUE(torch::equal(flat_parameters(*net), before));
}

TEST(CheckFiniteLoss, ANonFiniteLossIsRefusedNamingTheCall) {
  expect_nonfinite_loss_refused<accelerate::Accelerator<>>();
  expect_nonfinite_loss_refused<accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32,
                                                        accelerate::Accumulate<2>>>();
}

TEST(CheckFiniteLoss, OffTheNanReachesTheParameters) {
  accelerate::Accelerator<> acc{{.cpu = true, .seed = 1}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, opt] = acc.prepare(net, sgd);
  const auto data = regression_data(8);
  acc.backward(torch::mse_loss(model(data.inputs()), data.targets()) * std::nan(""));
  opt.step();
  EXPECT_TRUE(flat_parameters(*net).isnan().any().item<bool>());
}

// A user object that save_state visits (it outlives free_memory()).
struct Counter {
  accelerate::StateDict state_dict() const {
    accelerate::StateDict s;
    s.values["n"] = n;
    return s;
  }
  void load_state_dict(const accelerate::StateDict& s) { n = s.value<int>("n"); }
  int n = 0;
};

// free_memory() forgets the prepared objects, so they are freed once the caller drops its own,
// resets the micro-step counter, keeps user objects, and a new training's model is the
// checkpoint's first model again.
TEST(FreeMemory, ForgetsThePreparedObjectsAndKeepsUserObjects) {
  TempDir dir;
  accelerate::Accelerator<accelerate::SingleProcess, accelerate::Fp32, accelerate::Accumulate<2>> acc{{.cpu = true}};
  Counter counter;
  acc.register_for_checkpointing(counter);
  std::weak_ptr<accelerate::testing::TinyNetImpl> net_alive;
  std::weak_ptr<torch::optim::SGD> sgd_alive;
  std::weak_ptr<torch::optim::StepLR> lr_alive;
  {  // the caller's own handles end with this block
    auto net = std::make_shared<accelerate::testing::TinyNetImpl>();
    auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), 0.1);
    auto lr = std::make_shared<torch::optim::StepLR>(*sgd, 1, 0.5);
    net_alive = net;
    sgd_alive = sgd;
    lr_alive = lr;
    auto [model, opt, sched] = acc.prepare(net, sgd, lr);
    auto step = acc.accumulate(model);
    const auto data = regression_data(8);
    acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
  }
  EXPECT_EQ(acc.step(), 1u);
  EXPECT_FALSE(net_alive.expired()) << "the accelerator holds what it prepared";
  EXPECT_EQ(acc.checkpoint_entries().size(), 4u);

  acc.free_memory();
  EXPECT_TRUE(net_alive.expired());
  EXPECT_TRUE(sgd_alive.expired());
  EXPECT_TRUE(lr_alive.expired());
  EXPECT_EQ(acc.step(), 0u);
  ASSERT_EQ(acc.checkpoint_entries().size(), 1u) << "the registered user object stays";

  accelerate::testing::TinyNet wider(8, 32, 4);
  torch::optim::SGD wider_sgd(wider->parameters(), 0.1);
  auto [model, opt] = acc.prepare(wider, wider_sgd);
  acc.save_state(dir.path() / "checkpoint");
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "checkpoint" / "model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "checkpoint" / "model_1.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "checkpoint" / "custom_checkpoint_0.json"));
  acc.clear();  // the alias
  EXPECT_EQ(acc.checkpoint_entries().size(), 1u);
}

// Sizes above 16 really fail in LibTorch's CPU allocator (a petabyte): the function runs again
// at half the size until it fits, and its result comes back.
TEST(FindExecutableBatchSize, HalvesTheBatchSizeUntilItFits) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  std::vector<std::int64_t> tried;
  const std::int64_t result = acc.find_executable_batch_size(
      [&](std::int64_t batch_size) {
        tried.push_back(batch_size);
        const at::Tensor buffer = at::empty({batch_size > 16 ? std::int64_t{1} << 48 : batch_size});
        return buffer.numel() * 10;
      },
      128);
  EXPECT_EQ(result, 160);
  EXPECT_EQ(tried, (std::vector<std::int64_t>{128, 64, 32, 16}));
}

TEST(FindExecutableBatchSize, OtherErrorsPropagateAndZeroIsAnError) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  int calls = 0;
  EXPECT_THROW(acc.find_executable_batch_size([&](std::int64_t) { ++calls; throw std::runtime_error("bad data"); }, 64),
               std::runtime_error);
  EXPECT_EQ(calls, 1) << "not an out-of-memory error: no retry";

  std::vector<std::int64_t> tried;
  try {
    acc.find_executable_batch_size([&](std::int64_t batch_size) { tried.push_back(batch_size); throw std::bad_alloc(); }, 8);
    ADD_FAILURE() << "no error";
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no executable batch size found, reached zero from 8"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(tried, (std::vector<std::int64_t>{8, 4, 2, 1}));
  EXPECT_TRUE(accelerate::is_out_of_memory(c10::OutOfMemoryError({__func__, __FILE__, 1}, "CUDA out of memory.")));
  EXPECT_FALSE(accelerate::is_out_of_memory(std::runtime_error("shape mismatch")));
}

// acc.profile(): LibTorch's profiler around training steps writes profile_<rank>.json, a Chrome
// trace holding the model's operators (with their shapes on request); one profiler at a time.
TEST(Profile, WritesAChromeTraceOfTheOperators) {
  TempDir dir;
  accelerate::Accelerator<> acc{{.cpu = true}};
  TinyNet net;
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, sgd);
  const auto data = regression_data(8);
  std::filesystem::path path;
  {
    auto profiling = acc.profile({.output_trace_dir = dir.path() / "traces", .record_shapes = true});
    EXPECT_THROW(auto second = acc.profile(), accelerate::Error);
    acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
    opt.step();
    path = profiling.finish();
    bool addmm = false;
    for (const auto& event : profiling.events()) addmm = addmm || event.name() == "aten::addmm";
    EXPECT_TRUE(addmm) << "the Linear layers' forward";
  }
  EXPECT_EQ(path, dir.path() / "traces" / "profile_0.json");
  const auto trace = nlohmann::json::parse(std::ifstream(path));
  bool shaped = false, backward = false;
  for (const auto& event : trace.at("traceEvents")) {
    const std::string name = event.value("name", "");
    if (name == "aten::addmm" && event.contains("args") && event["args"].contains("Input Dims")) shaped = true;
    if (name.find("Backward") != std::string::npos) backward = true;
  }
  EXPECT_TRUE(shaped) << "aten::addmm with its input shapes";
  EXPECT_TRUE(backward) << "the backward pass's autograd nodes";

  {  // the scope's end writes the trace too
    auto profiling = acc.profile({.output_trace_dir = dir.path() / "again"});
    model(data.inputs());
  }
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "again" / "profile_0.json"));
}

// estimate_memory against what the tensors really hold after a step, for every optimizer kind
// it knows (one process: gradients are one copy).
TEST(EstimateMemory, EqualsTheBytesTheTensorsHoldAfterAStep) {
  using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;
  const std::vector<std::pair<std::string, MakeOptimizer>> optimizers{
      {"sgd", [](auto p) { return std::make_unique<torch::optim::SGD>(p, 0.1); }},
      {"sgd momentum", [](auto p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9)); }},
      {"adam", [](auto p) { return std::make_unique<torch::optim::Adam>(p); }},
      {"adamw amsgrad", [](auto p) { return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions().amsgrad(true)); }},
      {"rmsprop centered momentum",
       [](auto p) { return std::make_unique<torch::optim::RMSprop>(p, torch::optim::RMSpropOptions().centered(true).momentum(0.5)); }},
      {"adagrad", [](auto p) { return std::make_unique<torch::optim::Adagrad>(p); }}};
  const auto data = regression_data(8);
  for (const auto& [name, make] : optimizers) {
    accelerate::Accelerator<> acc{{.cpu = true}};
    TinyNet net;
    auto optimizer = make(net->parameters());
    auto [model, opt] = acc.prepare(net, *optimizer);
    acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
    opt.step();
    const accelerate::MemoryEstimate estimate = accelerate::estimate_memory(acc, model, opt);
    std::int64_t gradients = 0, state = 0;
    for (const auto& p : net->parameters()) gradients += p.grad().nbytes();
    for (const auto& [key, t] : accelerate::checkpoint::optimizer_state_dict(*optimizer).tensors) state += t.nbytes();
    EXPECT_EQ(estimate.parameters, accelerate::testing::parameter_bytes(*net)) << name;
    EXPECT_EQ(estimate.gradients, gradients) << name;
    EXPECT_EQ(estimate.optimizer_state, state) << name;
  }
  std::ostringstream text;
  text << accelerate::MemoryEstimate{1'500'000, 2'000'000, 500'000};
  EXPECT_EQ(text.str(), "parameters 1.50 MB, gradients 2.00 MB, optimizer state 0.50 MB, total 4.00 MB");
}

TEST(EstimateMemory, AnOptimizerOfUnknownStateIsNamed) {
  accelerate::Accelerator<> acc{{.cpu = true}};
  TinyNet net;
  torch::optim::LBFGS lbfgs(net->parameters());
  auto [model, opt] = acc.prepare(net, lbfgs);
  try {
    accelerate::estimate_memory(acc, model, opt);
    ADD_FAILURE() << "no error";
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("LBFGSOptions"), std::string::npos) << e.what();
  }
}

}  // namespace
