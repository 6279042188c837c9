// Defects found by trying the second wave from outside, each pinned in closed form with real
// processes: every Backend must give data parallel's numbers (which are PyTorch DDP's).
//   - sync_each_batch under ZeRO keeps every synchronised micro-step, not only the last;
//   - find_unused_parameters averages a parameter used anywhere in the accumulation window;
//   - a backward that throws leaves nothing behind that changes the next steps;
//   - Zero<...> in one plain process trains as SingleProcess, clipping included;
//   - opt.zero_grad() at the top of an accumulating loop means the same under every Backend;
//   - a NaN gradient reaches every parameter through clipping under every Backend (torch's rule);
//   - stage-3 checkpoints move between one process and several, bit for bit;
//   - a save_state that fails on one rank fails on every rank, promptly, and publishes nothing;
//   - LBFGS checkpoints, and trains across ranks as full-batch LBFGS (with Python's check);
//   - join_uneven_inputs divides as asked, refuses no_sync between forward and backward, and
//     ends on every rank when the last one cannot share its state;
//   - another ZeRO stage or bucket size is re-cut at the same world size, as at another;
//   - set_epoch after a resume on another number of processes keeps the position;
//   - an optimizer whose tensors file was lost is an error naming the tensor.
#include <accelerate/accelerate.hpp>
#include <accelerate/distributed/sharded.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../support/build_paths.hpp"
#include "../support/errors.hpp"
#include "../support/indexed_dataset.hpp"
#include "../support/prelude.hpp"
#include "../support/temp_dir.hpp"

namespace {

using namespace accelerate::testing::prelude;

bool has_argument(const std::string& wanted) {
  const auto lines = worker_arguments();
  return std::find(lines.begin(), lines.end(), wanted) != lines.end();
}

// Runs `fn.template operator()<Backend>()` for the Backend named by the worker's first argument.
template <class Fn>
int with_backend(Fn&& fn) {
  const auto args = worker_arguments();
  const std::string name = args.empty() ? "ddp" : args.front();
  if (name == "ddp") return fn.template operator()<accelerate::Gloo>();
  if (name == "zero1") return fn.template operator()<accelerate::Zero<accelerate::Gloo, 1>>();
  if (name == "zero2") return fn.template operator()<accelerate::Zero<accelerate::Gloo, 2>>();
  if (name == "zero3") return fn.template operator()<accelerate::Zero<accelerate::Gloo, 3>>();
  std::cerr << "unknown backend " << name << "\n";
  return 9;
}

const std::vector<std::string> kBackends = {"ddp", "zero1", "zero2", "zero3"};

// The model's whole parameters by name, from get_state_dict (every rank calls it).
template <class Acc, class Model>
std::map<std::string, torch::Tensor> whole(Acc& acc, Model& model) {
  return acc.get_state_dict(model);
}

// Writes what rank `rank` ended with, one line "name value..." per parameter.
void write_parameters(const std::map<std::string, torch::Tensor>& params, int rank) {
  std::ofstream out(job_dir() / ("params_rank" + std::to_string(rank) + ".txt"));
  out.precision(17);
  for (const auto& [name, tensor] : params) {
    out << name;
    const auto flat = tensor.to(torch::kDouble).reshape(-1);
    for (int64_t i = 0; i < flat.numel(); ++i) out << ' ' << flat[i].item<double>();
    out << '\n';
  }
}

// What write_parameters wrote: the first value of parameter `name` on rank `rank`.
double read_parameter(const accelerate::testing::JobResult& job, int rank, const std::string& name) {
  std::ifstream in(job.dir / ("params_rank" + std::to_string(rank) + ".txt"));
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string key;
    double value = 0;
    if (fields >> key >> value && key == name) return value;
  }
  ADD_FAILURE() << "no parameter " << name << " on rank " << rank << " in " << job.dir;
  return 0;
}

torch::nn::Linear unit_linear() {
  torch::nn::Linear linear(torch::nn::LinearOptions(1, 1).bias(false));
  torch::NoGradGuard no_grad;
  linear->weight.fill_(1.0);
  return linear;
}

// --- sync_each_batch: every synchronised micro-step adds to the window's gradient ------------
// w = 1, loss w^2 (x = 1), two micro-steps of a window of 2 (each divided by 2): the window's
// gradient is 2, so SGD 0.1 ends at w = 0.8 on every Backend.
ACCELERATE_WORKER(sync_each_batch_window) {
  return with_backend([]<class Backend>() {
    accelerate::Accelerator<Backend, accelerate::Fp32, accelerate::Accumulate<2>> acc{
        {.accumulation = {.sync_each_batch = true}, .process_group = {.timeout = 60s}}};
    auto net = unit_linear();
    torch::optim::SGD sgd(net->parameters(), 0.1);
    auto [model, opt] = acc.prepare(net, sgd);
    for (int micro = 0; micro < 2; ++micro) {
      auto step = acc.accumulate(model);
      acc.backward(model(torch::ones({1, 1})).pow(2).mean());
      opt.step();
      opt.zero_grad();
    }
    write_parameters(whole(acc, model), acc.process_index());
    return 0;
  });
}

class EveryBackend : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryBackend, SyncEachBatchKeepsEveryMicroStep) {
  auto job = run_job("sync_each_batch_window", {.world_size = 2, .args = {GetParam()}});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  for (int rank = 0; rank < 2; ++rank) EXPECT_NEAR(read_parameter(job, rank, "weight"), 0.8, 1e-6) << "rank " << rank;
}

// --- find_unused_parameters over an accumulation window ------------------------------------
// out = a x + (use_b ? b x : 0), a = b = 1, loss out^2 over a window of 2. Micro-step 1 uses b
// (x = 1 on rank 0, 2 on rank 1), micro-step 2 does not (x = 1). Gradients per rank: a 3 and 9,
// b 2 and 8; averaged: a 6, b 5; SGD 0.1: a = 0.4, b = 0.5 on both ranks (PyTorch DDP marks b
// used in the window and averages what it accumulated).
struct TwoBranchImpl : torch::nn::Module {
  TwoBranchImpl() : a(register_module("a", unit_linear())), b(register_module("b", unit_linear())) {}
  torch::Tensor forward(const torch::Tensor& x, bool use_b) { return use_b ? a(x) + b(x) : a(x); }
  torch::nn::Linear a, b;
};
TORCH_MODULE(TwoBranch);

ACCELERATE_WORKER(unused_in_last_micro_step) {
  return with_backend([]<class Backend>() {
    accelerate::Accelerator<Backend, accelerate::Fp32, accelerate::Accumulate<2>> acc{
        {.process_group = {.timeout = 60s}, .ddp = {.find_unused_parameters = true}}};
    TwoBranch net;
    torch::optim::SGD sgd(net->parameters(), 0.1);
    auto [model, opt] = acc.prepare(net, sgd);
    for (int micro = 0; micro < 2; ++micro) {
      auto step = acc.accumulate(model);
      const bool use_b = micro == 0;
      const double x = use_b ? 1.0 + acc.process_index() : 1.0;
      acc.backward(model(torch::full({1, 1}, x), use_b).pow(2).mean());
      opt.step();
      opt.zero_grad();
    }
    write_parameters(whole(acc, model), acc.process_index());
    return 0;
  });
}

TEST_P(EveryBackend, AParameterUsedEarlyInTheWindowIsAveraged) {
  auto job = run_job("unused_in_last_micro_step", {.world_size = 2, .args = {GetParam()}});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NEAR(read_parameter(job, rank, "a.weight"), 0.4, 1e-6) << "rank " << rank;
    EXPECT_NEAR(read_parameter(job, rank, "b.weight"), 0.5, 1e-6) << "rank " << rank;
  }
}

// --- a backward that throws --------------------------------------------------------------
// Its hook on the hidden activation throws (as an out-of-memory error would) after the output
// layer's gradients were ready, so their buckets (one per parameter) were launched. After it,
// zero_grad and two normal steps must end exactly where the same two steps end without it.
struct FailingNetImpl : torch::nn::Module {
  FailingNetImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 16))), fc2(register_module("fc2", torch::nn::Linear(16, 4))) {}
  torch::Tensor forward(const torch::Tensor& x, bool fail_in_backward) {
    auto hidden = torch::relu(fc1(x));
    if (fail_in_backward)
      hidden.register_hook([](const torch::Tensor&) { throw std::runtime_error("simulated out of memory in backward"); });
    return fc2(hidden);
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(FailingNet);

ACCELERATE_WORKER(backward_that_throws) {
  return with_backend([]<class Backend>() {
    accelerate::Accelerator<Backend> acc{
        {.process_group = {.timeout = 60s}, .ddp = {.bucket_cap_bytes = 1, .first_bucket_cap_bytes = 1}}};
    torch::manual_seed(3);
    FailingNet net;
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto [model, opt] = acc.prepare(net, sgd);
    const auto data = accelerate::testing::regression_data(64);
    auto batch = [&](int step) {
      const int64_t start = (step * acc.num_processes() + acc.process_index()) * 8;
      return std::pair{data.inputs().narrow(0, start, 8), data.targets().narrow(0, start, 8)};
    };
    if (has_argument("throw")) {
      try {
        auto [x, y] = batch(3);
        acc.backward(torch::mse_loss(model(x, true), y));
        std::cerr << "the backward did not throw\n";
        return 2;
      } catch (const std::exception& e) {
        if (std::string(e.what()).find("simulated out of memory") == std::string::npos) throw;
      }
      opt.zero_grad();
    }
    for (int step = 0; step < 2; ++step) {
      auto [x, y] = batch(step);
      acc.backward(torch::mse_loss(model(x, false), y));
      opt.step();
      opt.zero_grad();
    }
    write_parameters(whole(acc, model), acc.process_index());
    return 0;
  });
}

TEST_P(EveryBackend, ABackwardThatThrowsChangesNothingAfterIt) {
  auto clean = run_job("backward_that_throws", {.world_size = 2, .args = {GetParam()}});
  auto thrown = run_job("backward_that_throws", {.world_size = 2, .args = {GetParam(), "throw"}});
  ASSERT_EQ(clean.exit_code, 0) << clean.logs();
  ASSERT_EQ(thrown.exit_code, 0) << thrown.logs();
  for (int rank = 0; rank < 2; ++rank)
    for (const char* name : {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"})
      EXPECT_EQ(read_parameter(thrown, rank, name), read_parameter(clean, rank, name)) << name << ", rank " << rank;
}

// --- zero_grad at the top of an accumulating loop ---------------------------------------
// Off a boundary zero_grad does nothing; on it, it clears the window's local gradients, so only
// the boundary micro-step's gradient is stepped: w = 1 - 0.1 * (2 / 2) = 0.9, every Backend.
ACCELERATE_WORKER(zero_grad_first) {
  return with_backend([]<class Backend>() {
    accelerate::Accelerator<Backend, accelerate::Fp32, accelerate::Accumulate<2>> acc{{.process_group = {.timeout = 60s}}};
    auto net = unit_linear();
    torch::optim::SGD sgd(net->parameters(), 0.1);
    auto [model, opt] = acc.prepare(net, sgd);
    for (int micro = 0; micro < 2; ++micro) {
      auto step = acc.accumulate(model);
      opt.zero_grad();
      acc.backward(model(torch::ones({1, 1})).pow(2).mean());
      opt.step();
    }
    write_parameters(whole(acc, model), acc.process_index());
    return 0;
  });
}

TEST_P(EveryBackend, ZeroGradAtTheTopOfTheLoopMeansTheSame) {
  auto job = run_job("zero_grad_first", {.world_size = 2, .args = {GetParam()}});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  for (int rank = 0; rank < 2; ++rank) EXPECT_NEAR(read_parameter(job, rank, "weight"), 0.9, 1e-6) << "rank " << rank;
}

// --- clipping a NaN gradient ----------------------------------------------------------------
// One element's gradient is NaN (a hook on the parameter puts it there); ClipNorm's coefficient
// is then NaN, and torch's rule applies it to every gradient, so every parameter is NaN after
// the step: data parallel (torch's clip_grad_norm_) and every ZeRO stage alike.
ACCELERATE_WORKER(clip_nan_gradient) {
  return with_backend([]<class Backend>() {
    accelerate::Accelerator<Backend, accelerate::Fp32, accelerate::NoAccumulation, accelerate::ClipNorm<>> acc{
        {.clip = {.max_norm = 1.0}, .process_group = {.timeout = 60s}}};
    torch::manual_seed(3);
    accelerate::testing::TinyNet net;
    torch::optim::SGD sgd(net->parameters(), 0.1);
    auto [model, opt] = acc.prepare(net, sgd);
    net->fc1->weight.register_hook([](const torch::Tensor& grad) {
      auto poisoned = grad.clone();
      poisoned[0][0] = std::numeric_limits<float>::quiet_NaN();
      return poisoned;
    });
    acc.backward(model(torch::randn({4, 8})).pow(2).mean());
    opt.step();
    std::int64_t nan = 0, total = 0;
    for (const auto& [name, tensor] : whole(acc, model)) {
      nan += tensor.isnan().sum().template item<std::int64_t>();
      total += tensor.numel();
    }
    std::ofstream(job_dir() / ("nan_rank" + std::to_string(acc.process_index()))) << nan << ' ' << total;
    return 0;
  });
}

TEST_P(EveryBackend, ClippingANanGradientReachesEveryParameter) {
  auto job = run_job("clip_nan_gradient", {.world_size = 2, .args = {GetParam()}});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  for (int rank = 0; rank < 2; ++rank) {
    std::int64_t nan = -1, total = -2;
    std::ifstream(job.dir / ("nan_rank" + std::to_string(rank))) >> nan >> total;
    EXPECT_EQ(nan, total) << "rank " << rank << ": NaN parameters after the step";
  }
}

INSTANTIATE_TEST_SUITE_P(Regression, EveryBackend, ::testing::ValuesIn(kBackends),
                         [](const auto& info) { return info.param; });

// --- Zero<...> in one plain process -------------------------------------------------------
// No launcher: a world of one, which must train exactly as SingleProcess, clipping included
// (the Clip policy and acc.clip_grad_norm_).
template <class Backend>
torch::Tensor train_alone(bool explicit_clip) {
  accelerate::Accelerator<Backend, accelerate::Fp32, accelerate::Accumulate<2>, accelerate::ClipNorm<>> acc{
      {.cpu = true, .clip = {.max_norm = 0.05}}};
  torch::manual_seed(7);
  accelerate::testing::TinyNet net;
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  auto [model, opt] = acc.prepare(net, adamw);
  const auto data = accelerate::testing::regression_data(128);
  for (int micro = 0; micro < 12; ++micro) {
    auto step = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(data.inputs().narrow(0, micro * 8, 8)), data.targets().narrow(0, micro * 8, 8)));
    if (explicit_clip) acc.clip_grad_norm_(net->parameters(), 0.02);
    opt.step();
    opt.zero_grad();
  }
  std::vector<torch::Tensor> flat;
  for (const auto& [name, tensor] : acc.get_state_dict(model)) flat.push_back(tensor.reshape(-1));
  return torch::cat(flat);
}

TEST(ZeroInOneProcess, TrainsAsSingleProcessWithClipping) {
  for (const bool explicit_clip : {false, true}) {
    const auto single = train_alone<accelerate::SingleProcess>(explicit_clip);
    const auto zero1 = train_alone<accelerate::Zero<accelerate::Gloo, 1>>(explicit_clip);
    const auto zero2 = train_alone<accelerate::Zero<accelerate::Gloo, 2>>(explicit_clip);
    const auto zero3 = train_alone<accelerate::Zero<accelerate::Gloo, 3>>(explicit_clip);
    EXPECT_LE((zero1 - single).abs().max().item<double>(), 1e-6) << "explicit clip " << explicit_clip;
    EXPECT_LE((zero2 - single).abs().max().item<double>(), 1e-6) << "explicit clip " << explicit_clip;
    EXPECT_LE((zero3 - single).abs().max().item<double>(), 1e-6) << "explicit clip " << explicit_clip;
  }
}

// --- stage-3 checkpoints between one process and several ------------------------------------
using Zero3 = accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 3>>;

// A model of two units (a Sequential), AdamW, and the batch of `step` on `rank` of `world`.
struct Zero3Run {
  torch::nn::Sequential net{torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 4)};
  torch::optim::AdamW adamw{net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1)};
  accelerate::data::TensorDataset data = accelerate::testing::regression_data(256);
  template <class Model, class Optimizer>
  void train(Zero3& acc, Model& model, Optimizer& opt, int first, int last) {
    for (int step = first; step < last; ++step) {
      const int64_t start = (static_cast<int64_t>(step) * 2 + acc.process_index()) * 8;  // as on 2 ranks
      acc.backward(torch::mse_loss(model(data.inputs().narrow(0, start, 8)), data.targets().narrow(0, start, 8)));
      opt.step();
      opt.zero_grad();
    }
  }
};

torch::Tensor flat(const std::map<std::string, torch::Tensor>& state) {
  std::vector<torch::Tensor> parts;
  for (const auto& [name, tensor] : state) parts.push_back(tensor.reshape(-1));
  return torch::cat(parts);
}

// "save DIR": 3 steps, a checkpoint in DIR, 3 more steps. "resume DIR": the checkpoint in DIR
// (written by another number of processes), then the last 3 steps. Both write the parameters.
ACCELERATE_WORKER(zero3_checkpoint) {
  const auto args = worker_arguments();
  Zero3 acc{{.process_group = {.timeout = 60s}}};
  Zero3Run run;
  auto [model, opt] = acc.prepare(run.net, run.adamw);
  if (args.at(0) == "save") {
    run.train(acc, model, opt, 0, 3);
    acc.save_state(args.at(1));
    if (acc.is_main_process()) save_tensor(job_dir() / "at_checkpoint.bin", flat(acc.get_state_dict(model)));
    else (void)acc.get_state_dict(model);
  } else {
    acc.load_state(args.at(1), {.allow_world_size_change = true});
  }
  run.train(acc, model, opt, 3, 6);
  const auto end = flat(acc.get_state_dict(model));
  if (acc.is_main_process()) save_tensor(job_dir() / "end.bin", end);
  return 0;
}

TEST(Zero3Checkpoint, MovesFromTwoProcessesToOneAndBackBitForBit) {
  accelerate::testing::TempDir dir;
  auto two = run_job("zero3_checkpoint", {.world_size = 2, .args = {"save", (dir / "two").string()}});
  ASSERT_EQ(two.exit_code, 0) << two.logs();
  {
    Zero3 acc{{.cpu = true}};  // one process, no launcher
    Zero3Run run;
    auto [model, opt] = acc.prepare(run.net, run.adamw);
    acc.load_state(dir / "two", {.allow_world_size_change = true});
    EXPECT_TRUE(torch::equal(flat(acc.get_state_dict(model)).to(torch::kDouble), load_tensor(two.dir / "at_checkpoint.bin")))
        << "the parameters of 2 ranks, assembled in one process";
    acc.save_state(dir / "one");
  }
  auto back = run_job("zero3_checkpoint", {.world_size = 2, .args = {"resume", (dir / "one").string()}});
  ASSERT_EQ(back.exit_code, 0) << back.logs();
  EXPECT_TRUE(torch::equal(load_tensor(back.dir / "end.bin"), load_tensor(two.dir / "end.bin")))
      << "2 -> 1 -> 2 processes ends where the uninterrupted run ends";
}

// --- a save_state that fails on one rank -----------------------------------------------------
// An object whose state_dict() throws (registered objects are written by rank 0 alone), and a
// save hook that throws on rank 1 alone (while the files are written): both ranks raise, the
// folder keeps the checkpoint saved before, and the next collective pairs as it should.
struct Refusing {
  bool refuse = false;
  accelerate::StateDict state_dict() const {
    if (refuse) throw std::runtime_error("this object refuses to be saved");
    return {};
  }
  void load_state_dict(const accelerate::StateDict&) {}
};

ACCELERATE_WORKER(save_fails_on_one_rank) {
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 20s}}};
  const std::filesystem::path dir = job_dir() / "state";
  Refusing object;
  acc.register_for_checkpointing(object);
  accelerate::testing::TinyNet net;
  auto [model] = acc.prepare(net);
  acc.save_state(dir);
  const auto manifest = [&] {
    std::ifstream in(dir / "accelerate_state.json");
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string before = manifest();
  std::string problems;
  const auto check = [&](const std::string& what, const std::string& error, const std::string& expected) {
    if (error.find(expected) == std::string::npos) problems += what + ": " + error + "; ";
    if (manifest() != before) problems += what + ": the checkpoint changed; ";
    for (const auto& entry : std::filesystem::directory_iterator(job_dir()))
      if (entry.path().filename().string().ends_with(".incomplete")) problems += what + ": staging left; ";
    const auto sum = acc.reduce(torch::tensor({acc.process_index() + 1.0}));  // pairs with the peer's
    if (sum.item<double>() != 3.0) problems += what + ": the next collective gave " + std::to_string(sum.item<double>()) + "; ";
  };
  // The failing rank raises its own error, whatever its type.
  const auto message_of = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  object.refuse = acc.is_main_process();
  check("state_dict", message_of([&] { acc.save_state(dir); }),
        acc.is_main_process() ? "refuses to be saved" : "rank 0 failed");
  object.refuse = false;
  auto hook = acc.register_save_state_pre_hook([&](const std::filesystem::path&) {
    if (acc.process_index() == 1) throw accelerate::Error("the hook failed on rank 1");
  });
  check("hook", accelerate::testing::error_of([&] { acc.save_state(dir); }),
        acc.process_index() == 1 ? "the hook failed" : "rank 1 failed");
  check("asynchronous hook", accelerate::testing::error_of([&] { acc.save_state(dir, {.asynchronous = true}); }),
        acc.process_index() == 1 ? "the hook failed" : "rank 1 failed");
  hook.remove();
  acc.save_state(dir);  // and saving works again
  if (manifest() == before) problems += "the next save published nothing; ";
  if (!problems.empty()) std::cerr << problems << "\n";
  return problems.empty() ? 0 : 3;
}

TEST(SaveState, AFailureOnOneRankEndsTheSaveOnEveryRank) {
  auto job = run_job("save_fails_on_one_rank", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
}

// --- LBFGS -----------------------------------------------------------------------------------
constexpr int kLbfgsSteps = 3;
torch::optim::LBFGSOptions lbfgs_options() { return torch::optim::LBFGSOptions(0.5).max_iter(8).history_size(5); }

// Without biases, all-zero inputs give a loss of exactly 0 whatever the weights: alone, that
// rank's LBFGS would stop after its first iteration (no change in the loss) while the other goes on.
torch::nn::Sequential bias_free_net() {
  using torch::nn::LinearOptions;
  return torch::nn::Sequential(torch::nn::Linear(LinearOptions(8, 16).bias(false)), torch::nn::ReLU(),
                               torch::nn::Linear(LinearOptions(16, 4).bias(false)));
}

// Closure steps of a prepared LBFGS on (x, y); returns nothing, changes the model.
template <class Acc, class Model, class Optimizer>
void lbfgs_steps(Acc& acc, Model& model, Optimizer& opt, const torch::Tensor& x, const torch::Tensor& y, int steps) {
  for (int step = 0; step < steps; ++step)
    opt.step([&] {
      opt.zero_grad();
      auto loss = torch::mse_loss(model(x), y);
      acc.backward(loss);
      return loss;
    });
}

// Rank 0's data is all zeros (its own loss would stop LBFGS after one iteration), rank 1's is
// not: with the mean loss over ranks both run full-batch LBFGS on the two halves together.
std::pair<torch::Tensor, torch::Tensor> lbfgs_half(int rank) {
  const auto data = accelerate::testing::regression_data(16, 8, 4, 77);
  if (rank == 0) return {torch::zeros({16, 8}), torch::zeros({16, 4})};
  return {data.inputs(), data.targets()};
}

ACCELERATE_WORKER(lbfgs_two_ranks) {
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 60s}}};
  torch::manual_seed(11);
  auto net = bias_free_net();
  torch::optim::LBFGS lbfgs(net->parameters(), lbfgs_options());
  auto [model, opt] = acc.prepare(net, lbfgs);
  if (acc.is_main_process()) accelerate::checkpoint::save_safetensors(job_dir() / "initial.safetensors", acc.get_state_dict(model));
  auto [x, y] = lbfgs_half(acc.process_index());
  lbfgs_steps(acc, model, opt, x, y, kLbfgsSteps);
  accelerate::checkpoint::save_safetensors(job_dir() / ("final_rank" + std::to_string(acc.process_index()) + ".safetensors"),
                                           acc.get_state_dict(model));
  return 0;
}

TEST(Lbfgs, TwoRanksRunFullBatchLbfgs) {
  auto job = run_job("lbfgs_two_ranks", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  auto final0 = accelerate::checkpoint::SafetensorsFile::open(job.dir / "final_rank0.safetensors").tensors();
  auto final1 = accelerate::checkpoint::SafetensorsFile::open(job.dir / "final_rank1.safetensors").tensors();
  for (const auto& [name, tensor] : final0) EXPECT_TRUE(torch::equal(tensor, final1.at(name))) << name << ": replicas differ";

  // One process, full batch, from the same initial values.
  accelerate::Accelerator<> acc{{.cpu = true}};
  auto net = bias_free_net();
  accelerate::load_checkpoint_in_model(*net, job.dir / "initial.safetensors");
  torch::optim::LBFGS lbfgs(net->parameters(), lbfgs_options());
  auto [model, opt] = acc.prepare(net, lbfgs);
  const auto [x0, y0] = lbfgs_half(0);
  const auto [x1, y1] = lbfgs_half(1);
  const auto x = torch::cat({x0, x1}), y = torch::cat({y0, y1});
  lbfgs_steps(acc, model, opt, x, y, kLbfgsSteps);
  bool moved = false;
  const auto initial = accelerate::checkpoint::SafetensorsFile::open(job.dir / "initial.safetensors").tensors();
  for (const auto& [name, tensor] : acc.get_state_dict(model)) {
    EXPECT_LE((tensor - final0.at(name)).abs().max().item<double>(), 1e-5) << name;
    moved = moved || !torch::equal(tensor, initial.at(name));
  }
  EXPECT_TRUE(moved) << "LBFGS changed nothing";

  // PyTorch's own torch.optim.LBFGS on the same full batch ends at the same parameters.
  if (!std::filesystem::exists(ACCELERATE_TEST_PYTHON)) GTEST_SKIP() << "no Python environment for the cross-check";
  accelerate::checkpoint::save_safetensors(job.dir / "data.safetensors", {{"x", x}, {"y", y}});
  const std::string command = std::string(ACCELERATE_TEST_PYTHON) + " " + ACCELERATE_BASELINE_DIR + "/lbfgs_full_batch.py " +
                              job.dir.string() + " " + std::to_string(kLbfgsSteps);
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

// A prepared LBFGS's state (counters, direction, history) is saved and restored exactly: the
// steps after a resume equal those of the uninterrupted run.
TEST(Lbfgs, ItsStateResumesExactly) {
  accelerate::testing::TempDir dir;
  const auto [x, y] = lbfgs_half(1);
  auto run = [&](bool resume) {
    accelerate::Accelerator<> acc{{.cpu = true}};
    torch::manual_seed(11);
    accelerate::testing::TinyNet net;
    torch::optim::LBFGS lbfgs(net->parameters(), lbfgs_options());
    auto [model, opt] = acc.prepare(net, lbfgs);
    if (resume) {
      acc.load_state(dir.path());
    } else {
      lbfgs_steps(acc, model, opt, x, y, 2);
      acc.save_state(dir.path());
    }
    lbfgs_steps(acc, model, opt, x, y, 2);
    return flat(acc.get_state_dict(model));
  };
  const auto straight = run(false);
  const auto resumed = run(true);
  EXPECT_TRUE(torch::equal(straight, resumed));
}

// --- join_uneven_inputs: the divisor, and no_sync between forward and backward ---------------
// w = 1, loss (w x)^2 with x = 1, SGD 0.1; rank 0 has 1 batch, rank 1 has 2. Step 1 on both:
// w = 0.8. Step 2 on rank 1 alone, gradient 1.6: over the ranks training, w = 0.64; over the
// initial world size (PyTorch DDP's join default), w = 0.72.
ACCELERATE_WORKER(join_divisor) {
  const bool initial = has_argument("initial");
  accelerate::Accelerator<accelerate::Gloo> acc{
      {.process_group = {.timeout = 60s}, .ddp = {.join_divide_by_initial_world_size = initial}}};
  auto net = unit_linear();
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, sgd);
  {
    auto join = acc.join_uneven_inputs(model);
    for (int k = 0; k < 1 + acc.process_index(); ++k) {
      acc.backward(model(torch::ones({1, 1})).pow(2).mean());
      opt.step();
      opt.zero_grad();
    }
  }
  write_parameters(whole(acc, model), acc.process_index());
  return 0;
}

TEST(JoinUnevenInputs, DividesByTheRanksTrainingOrByTheInitialWorldSize) {
  auto training = run_job("join_divisor", {.world_size = 2});
  auto initial = run_job("join_divisor", {.world_size = 2, .args = {"initial"}});
  ASSERT_EQ(training.exit_code, 0) << training.logs();
  ASSERT_EQ(initial.exit_code, 0) << initial.logs();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NEAR(read_parameter(training, rank, "weight"), 0.64, 1e-6) << "rank " << rank;
    EXPECT_NEAR(read_parameter(initial, rank, "weight"), 0.72, 1e-6) << "rank " << rank;
  }
}

ACCELERATE_WORKER(join_no_sync_after_forward) {
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 20s}}};
  auto net = unit_linear();
  auto [model] = acc.prepare(net);
  std::string error;
  {
    auto join = acc.join_uneven_inputs(model);
    const auto loss = model(torch::ones({1, 1})).pow(2).mean();
    auto silent = acc.no_sync(model);
    error = accelerate::testing::error_of([&] { acc.backward(loss); });
  }
  if (error.find("between a forward and its backward") == std::string::npos) {
    std::cerr << "rank " << acc.process_index() << ": " << error << "\n";
    return 3;
  }
  return 0;
}

TEST(JoinUnevenInputs, NoSyncOpenedBetweenForwardAndBackwardIsAnError) {
  auto job = run_job("join_no_sync_after_forward", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
}

// --- another ZeRO stage or bucket size at the same number of processes -----------------------
// Re-cut, as at another number of processes: a Zero<_, 1> checkpoint with one bucket resumed by
// Zero<_, 2> with a bucket per parameter (allow_configuration_change) goes on as Zero<_, 1> would.
template <class Backend>
int stage_change(const std::vector<std::string>& args) {
  const bool resume = args.at(1) == "resume";
  accelerate::AcceleratorOptions options{.process_group = {.timeout = 60s}};
  if (resume) options.ddp.bucket_cap_bytes = options.ddp.first_bucket_cap_bytes = 1;
  accelerate::Accelerator<Backend> acc{options};
  torch::manual_seed(21);
  accelerate::testing::TinyNet net;
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(0.01));
  auto [model, opt] = acc.prepare(net, adamw);
  const auto data = accelerate::testing::regression_data(256);
  auto train = [&](int first, int last) {
    for (int step = first; step < last; ++step) {
      const int64_t start = (static_cast<int64_t>(step) * 2 + acc.process_index()) * 8;
      acc.backward(torch::mse_loss(model(data.inputs().narrow(0, start, 8)), data.targets().narrow(0, start, 8)));
      opt.step();
      opt.zero_grad();
    }
  };
  if (resume) {
    acc.load_state(args.at(2), {.allow_configuration_change = true});
  } else {
    train(0, 3);
    acc.save_state(args.at(2));
  }
  train(3, 6);
  const auto end = flat(acc.get_state_dict(model));
  if (acc.is_main_process()) save_tensor(job_dir() / "end.bin", end);
  return 0;
}

ACCELERATE_WORKER(stage_change) {
  const auto args = worker_arguments();
  if (args.at(0) == "zero1") return stage_change<accelerate::Zero<accelerate::Gloo, 1>>(args);
  return stage_change<accelerate::Zero<accelerate::Gloo, 2>>(args);
}

TEST(Zero, AnotherStageOrBucketSizeAtTheSameWorldSizeIsReCut) {
  accelerate::testing::TempDir dir;
  auto first = run_job("stage_change", {.world_size = 2, .args = {"zero1", "save", (dir / "state").string()}});
  ASSERT_EQ(first.exit_code, 0) << first.logs();
  auto second = run_job("stage_change", {.world_size = 2, .args = {"zero2", "resume", (dir / "state").string()}});
  ASSERT_EQ(second.exit_code, 0) << second.logs();
  EXPECT_LE((load_tensor(second.dir / "end.bin") - load_tensor(first.dir / "end.bin")).abs().max().item<double>(), 1e-6);
}

// --- an optimizer whose tensors file was lost -----------------------------------------------
// optimizer.safetensors deleted with its line in the manifest: optimizer.json still says which
// moments each state had, so load_state names the missing one and changes nothing, rather than
// resuming an optimizer without its moments.
TEST(LoadState, AnOptimizerWhoseTensorsWereLostIsAnErrorNamingThem) {
  accelerate::testing::TempDir dir;
  accelerate::Accelerator<> acc{{.cpu = true}};
  torch::manual_seed(3);
  accelerate::testing::TinyNet net;
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(0.01));
  auto [model, opt] = acc.prepare(net, adamw);
  acc.backward(model(torch::randn({4, 8})).pow(2).mean());
  opt.step();
  acc.save_state(dir.path());
  std::filesystem::remove(dir / "optimizer.safetensors");
  const auto manifest_path = dir / "accelerate_state.json";
  auto manifest = nlohmann::json::parse(std::ifstream(manifest_path));
  manifest["files"].erase("optimizer.safetensors");
  std::ofstream(manifest_path) << manifest.dump();
  const auto before = flat(acc.get_state_dict(model));
  const auto error = accelerate::testing::error_of([&] { acc.load_state(dir.path()); });
  EXPECT_NE(error.find("state.0.exp_avg is missing"), std::string::npos) << error;
  EXPECT_NE(error.find("optimizer"), std::string::npos) << error;
  EXPECT_TRUE(torch::equal(flat(acc.get_state_dict(model)), before));
}

// --- set_epoch after a resume on another number of processes --------------------------------
// 48 samples in batches of 2, saved by 2 ranks after 6 steps (24 samples); resumed by 3 ranks
// whose loop calls loader.set_epoch(0) at the top of the epoch (Transformers' Trainer): the 24
// samples left, each once, none of those consumed before.
ACCELERATE_WORKER(set_epoch_after_reshard) {
  const auto args = worker_arguments();
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 60s}}};
  const auto data = accelerate::testing::regression_data(48);
  auto [loader] = acc.prepare(accelerate::DataLoader(accelerate::testing::IndexedDataset{data.inputs(), data.targets()},
                                                     {.batch_size = 2, .shuffle = true, .seed = 5}));
  std::ofstream seen(job_dir() / ("seen_rank" + std::to_string(acc.process_index())));
  if (args.at(0) == "save") {
    int steps = 0;
    for (auto& [x, y, indices] : loader) {
      for (int64_t k = 0; k < indices.numel(); ++k) seen << indices[k].item<int64_t>() << "\n";
      if (++steps == 6) break;
    }
    acc.save_state(args.at(1));
  } else {
    acc.load_state(args.at(1), {.allow_world_size_change = true});
    loader.set_epoch(0);
    for (auto& [x, y, indices] : loader)
      for (int64_t k = 0; k < indices.numel(); ++k) seen << indices[k].item<int64_t>() << "\n";
  }
  return 0;
}

TEST(Resharding, SetEpochOfTheResumedEpochKeepsItsPosition) {
  accelerate::testing::TempDir dir;
  auto read = [](const accelerate::testing::JobResult& job, int ranks) {
    std::multiset<int64_t> indices;
    for (int r = 0; r < ranks; ++r) {
      std::ifstream in(job.dir / ("seen_rank" + std::to_string(r)));
      for (int64_t i = 0; in >> i;) indices.insert(i);
    }
    return indices;
  };
  auto two = run_job("set_epoch_after_reshard", {.world_size = 2, .args = {"save", (dir / "state").string()}});
  ASSERT_EQ(two.exit_code, 0) << two.logs();
  auto three = run_job("set_epoch_after_reshard", {.world_size = 3, .args = {"resume", (dir / "state").string()}});
  ASSERT_EQ(three.exit_code, 0) << three.logs();
  const auto before = read(two, 2), after = read(three, 3);
  EXPECT_EQ(before.size(), 24u);
  EXPECT_EQ(after.size(), 24u) << "the samples left, not the whole epoch again";
  std::multiset<int64_t> all(before);
  all.insert(after.begin(), after.end());
  for (int64_t i = 0; i < 48; ++i) EXPECT_EQ(all.count(i), 1u) << "sample " << i;
}

// --- the end of join_uneven_inputs when the last rank cannot share its state -----------------
// A prepared optimizer of the user's whose state_dict() throws on rank 1, the last to finish:
// both ranks raise (rank 1 its own error, rank 0 one naming rank 1) instead of rank 0 waiting in
// a broadcast rank 1 never joins; the next collective pairs as it should.
struct RefusingSgd : torch::optim::SGD {
  using torch::optim::SGD::SGD;
  bool refuse = false;
  accelerate::StateDict state_dict() const {
    if (refuse) throw accelerate::Error("this optimizer refuses to share its state");
    return {};
  }
  void load_state_dict(const accelerate::StateDict&) {}
};

ACCELERATE_WORKER(join_end_fails_on_root) {
  accelerate::Accelerator<accelerate::Gloo> acc{{.process_group = {.timeout = 20s}}};
  auto net = unit_linear();
  RefusingSgd sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  sgd.refuse = acc.process_index() == 1;
  auto [model, opt] = acc.prepare(net, sgd);
  std::string error;
  {
    auto join = acc.join_uneven_inputs(model);
    for (int k = 0; k < 1 + acc.process_index(); ++k) {
      acc.backward(model(torch::ones({1, 1})).pow(2).mean());
      opt.step();
      opt.zero_grad();
    }
    error = accelerate::testing::error_of([&] { join.join(); });
  }
  const std::string expected = acc.process_index() == 1 ? "refuses to share" : "rank 1, the last to finish";
  const auto sum = acc.reduce(torch::tensor({acc.process_index() + 1.0}));
  if (error.find(expected) == std::string::npos || sum.item<double>() != 3.0) {
    std::cerr << "rank " << acc.process_index() << ": " << error << "; next collective " << sum.item<double>() << "\n";
    return 3;
  }
  return 0;
}

TEST(JoinUnevenInputs, ARankThatCannotShareItsStateEndsTheScopeOnEveryRank) {
  auto job = run_job("join_end_fails_on_root", {.world_size = 2});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
}

}  // namespace
