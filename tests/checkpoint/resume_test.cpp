// Exact resume across processes: training 2 epochs straight, and training, saving, starting a
// new process, loading and finishing, give byte-identical model.safetensors — with 1 and 2
// ranks, with accumulation, with bf16, saved at an epoch's end or in its middle.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <fstream>

#include "../support/models.hpp"
#include "../support/multiprocess.hpp"
#include "../support/temp_dir.hpp"

namespace {

using namespace std::chrono_literals;

// Dropout (the generators matter) and batch norm (buffers matter).
struct ResumeNetImpl : torch::nn::Module {
  ResumeNetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 32))),
        norm(register_module("norm", torch::nn::BatchNorm1d(32))),
        drop(register_module("drop", torch::nn::Dropout(0.2))),
        fc2(register_module("fc2", torch::nn::Linear(32, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(drop(torch::relu(norm(fc1(x))))); }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d norm;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
};
TORCH_MODULE(ResumeNet);

struct Case {
  std::string phase;       // straight | first | second
  std::string precision;   // no | bf16
  std::size_t accum = 1;
  int stop_epoch = 0;      // first: save in this epoch...
  int stop_batch = -1;     // ...after this many batches (-1: at its end)
  std::string project;
  std::string out;
};

Case read_case() {
  std::istringstream in(std::getenv("ACCELERATE_TEST_ARGS"));
  Case c;
  in >> c.phase >> c.precision >> c.accum >> c.stop_epoch >> c.stop_batch >> c.project >> c.out;
  return c;
}

template <class Acc>
int train(const Case& c) {
  Acc acc{{.seed = 11,
           .accumulation = {.num_steps = c.accum > 1 ? c.accum : 0},
           .process_group = {.timeout = 60s},
           .project = {.project_dir = c.project, .automatic_checkpoint_naming = true}}};
  ResumeNet net;
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::StepLR lr(adam, /*step_size=*/3, /*gamma=*/0.7);
  auto [model, opt, sched, loader] = acc.prepare(
      net, adam, lr, accelerate::DataLoader(accelerate::testing::regression_data(96), {.batch_size = 8, .shuffle = true}));
  if (c.phase == "second") acc.load_state();
  for (int epoch = static_cast<int>(loader.epoch()); epoch < 2; ++epoch) {
    for (auto& [x, y] : loader) {
      auto step = acc.accumulate(model);
      acc.backward(torch::mse_loss(model(x), y));
      opt.step();
      sched.step();
      opt.zero_grad();
      if (c.phase == "first" && epoch == c.stop_epoch && static_cast<int>(loader.batches_consumed()) == c.stop_batch) {
        acc.save_state();
        return 0;
      }
    }
    if (c.phase == "first" && epoch == c.stop_epoch && c.stop_batch < 0) {
      acc.save_state();
      return 0;
    }
  }
  acc.save_model(model, c.out);
  return 0;
}

using Resumable = accelerate::all_combinations<
    accelerate::type_list<accelerate::SingleProcess, accelerate::Gloo>,
    accelerate::type_list<accelerate::Fp32, accelerate::Bf16>,
    accelerate::type_list<accelerate::NoAccumulation, accelerate::AccumulateDynamic>,
    accelerate::type_list<accelerate::NoClip>>;

ACCELERATE_WORKER(resume) {
  const Case c = read_case();
  accelerate::RunConfig config{.mixed_precision = c.precision,
                               .num_processes = std::atoi(std::getenv("WORLD_SIZE")),
                               .gradient_accumulation_steps = c.accum};
  return accelerate::dispatch(Resumable{}, config, [&]<class Acc>() { return train<Acc>(c); });
}

std::string bytes_of(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

struct ResumeCase {
  int world;
  std::string precision;
  std::size_t accum;
  int stop_epoch;
  int stop_batch;

  std::string name() const {
    return std::to_string(world) + "ranks_" + (precision == "no" ? "fp32" : precision) + "_accum" +
           std::to_string(accum) + "_epoch" + std::to_string(stop_epoch) +
           (stop_batch < 0 ? std::string("_end") : "_batch" + std::to_string(stop_batch));
  }
  // gtest prints the parameter in the test's description; bytes would say nothing.
  friend void PrintTo(const ResumeCase& c, std::ostream* out) { *out << c.name(); }
};

class Resume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(Resume, IsByteIdenticalToAnUninterruptedRun) {
  const auto& p = GetParam();
  accelerate::testing::TempDir dir;
  auto run = [&](const std::string& phase, const std::string& project, const std::string& out) {
    std::ostringstream args;
    args << phase << ' ' << p.precision << ' ' << p.accum << ' ' << p.stop_epoch << ' ' << p.stop_batch << ' '
         << (dir / project).string() << ' ' << (dir / out).string();
    auto job = accelerate::testing::run_job("resume", {.world_size = p.world, .args = {args.str()}});
    EXPECT_EQ(job.exit_code, 0) << phase << "\n" << job.logs();
  };
  run("straight", "straight_project", "straight_model");
  run("first", "resumed_project", "unused");
  ASSERT_FALSE(accelerate::checkpoint::list_checkpoints(dir / "resumed_project" / "checkpoints").empty());
  run("second", "resumed_project", "resumed_model");
  const auto straight = bytes_of(dir / "straight_model" / "model.safetensors");
  ASSERT_FALSE(straight.empty());
  EXPECT_TRUE(straight == bytes_of(dir / "resumed_model" / "model.safetensors"));
}

INSTANTIATE_TEST_SUITE_P(
    Runs, Resume,
    ::testing::Values(ResumeCase{1, "no", 1, 0, -1},   // one process, saved at the end of epoch 0
                      ResumeCase{1, "no", 1, 0, 5},    // ... in the middle of epoch 0
                      ResumeCase{1, "no", 3, 1, 6},    // accumulation, mid-epoch on a boundary
                      ResumeCase{1, "bf16", 1, 1, 7},  // bf16, mid-epoch
                      ResumeCase{2, "no", 1, 0, -1},   // two ranks
                      ResumeCase{2, "no", 2, 0, 4},    // two ranks, accumulation, mid-epoch
                      ResumeCase{2, "bf16", 2, 0, -1}),
    [](const auto& info) { return info.param.name(); });

}  // namespace
