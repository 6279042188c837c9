// compare_step: the per-step time of this library on the workloads bench/compare_python.sh
// also runs with Python Accelerate and PyTorch DDP. Prints one JSON line from rank 0:
// {"impl": "accelerate-cpp", "model", "nproc", "accum", "median_step_us", "steps"}.
//   compare_step --model tiny|mlp [--nproc N] [--accum K] [--steps S] [--warmup W]
#include <accelerate/accelerate.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

struct Args {
  std::string model = "tiny";
  std::size_t accum = 1;
  int steps = 300;
  int warmup = 30;
};

// The same modules as bench/python/models.py.
torch::nn::Sequential make_model(const std::string& name) {
  if (name == "tiny") return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 4));
  return torch::nn::Sequential(torch::nn::Linear(784, 256), torch::nn::ReLU(), torch::nn::Linear(256, 128),
                               torch::nn::ReLU(), torch::nn::Linear(128, 10));
}

template <class Acc>
int run(const Args& a) {
  Acc acc{{.seed = 0, .accumulation = {.num_steps = a.accum > 1 ? a.accum : 0}}};
  auto net = make_model(a.model);
  const int64_t in = a.model == "tiny" ? 8 : 784, classes = a.model == "tiny" ? 4 : 10, batch = a.model == "tiny" ? 16 : 64;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto [model, opt] = acc.prepare(net, sgd);
  const auto x = torch::randn({batch, in});
  const auto y = torch::randint(0, classes, {batch});
  std::vector<double> micros;
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto step = acc.accumulate(model);
    acc.backward(torch::cross_entropy_loss(model(x), y));
    opt.step();
    opt.zero_grad();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (i >= a.warmup) micros.push_back(us);
  }
  std::nth_element(micros.begin(), micros.begin() + micros.size() / 2, micros.end());
  if (acc.is_main_process()) {
    std::cout << nlohmann::json{{"impl", "accelerate-cpp"}, {"model", a.model}, {"nproc", acc.num_processes()},
                                {"accum", a.accum}, {"median_step_us", micros[micros.size() / 2]}, {"steps", a.steps}}
                     .dump()
              << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return accelerate::launch(argc, argv, [](int argc, char** argv) {
    torch::set_num_threads(1);
    Args a;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string flag = argv[i], value = argv[i + 1];
      if (flag == "--model") a.model = value;
      else if (flag == "--accum") a.accum = std::stoul(value);
      else if (flag == "--steps") a.steps = std::stoi(value);
      else if (flag == "--warmup") a.warmup = std::stoi(value);
    }
    accelerate::RunConfig config{.num_processes = accelerate::distributed::detect_environment().world_size,
                                 .gradient_accumulation_steps = a.accum};
    using Presets = accelerate::all_combinations<
        accelerate::type_list<accelerate::SingleProcess, accelerate::Gloo>, accelerate::type_list<accelerate::Fp32>,
        accelerate::type_list<accelerate::NoAccumulation, accelerate::AccumulateDynamic>,
        accelerate::type_list<accelerate::NoClip>>;
    return accelerate::dispatch(Presets{}, config, [&]<class Acc>() { return run<Acc>(a); });
  });
}
