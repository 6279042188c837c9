// bench_reshard: load_state of a checkpoint written by another number of processes (resharded)
// next to one of the same size written by this number, for ZeRO stage 2 with AdamW (~300 MB of
// training state: 25M parameters, two moments). reshard.sh runs it:
//   bench_reshard --nproc 2 save DIR/two    (2 ranks write their optimizer slices)
//   bench_reshard --nproc 1 save DIR/one    (the same state, written by one process)
//   bench_reshard load DIR                  (one process: times both loads, prints JSON)
#include <accelerate/accelerate.hpp>
#include <accelerate/distributed/sharded.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "large_model.hpp"

namespace {

using Acc = accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 2>>;

using accelerate::bench::Large;

// One optimizer step (so AdamW has both moments), from the same seed whatever the world size.
struct Run {
  Acc acc{{.seed = 0}};
  Large net;
  torch::optim::AdamW adam{net->parameters()};
  Run() {
    auto [model, opt] = acc.prepare(net, adam);
    acc.backward(model(torch::randn({2, 2048})).sum());
    opt.step();
  }
};

double median_ms(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  return accelerate::launch(argc, argv, [](int argc, char** argv) {
    if (argc != 3) {
      std::cerr << "usage: bench_reshard [--nproc N] save DIR | bench_reshard load DIR\n";
      return 2;
    }
    const std::string mode = argv[1];
    const std::filesystem::path dir = argv[2];
    Run run;
    if (mode == "save") {
      run.acc.save_state(dir);
      return 0;
    }
    std::vector<double> same, resharded;
    for (int i = 0; i < 5; ++i) {
      for (const auto& [folder, samples] : {std::pair{dir / "one", &same}, std::pair{dir / "two", &resharded}}) {
        const auto start = std::chrono::steady_clock::now();
        run.acc.load_state(folder, {.allow_world_size_change = true});
        samples->push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      }
    }
    std::cout << "{\"load_same_world_ms\": " << median_ms(same) << ", \"load_resharded_from_2_ms\": "
              << median_ms(resharded) << ", \"ratio\": " << median_ms(resharded) / median_ms(same) << "}\n";
    return 0;
  });
}
