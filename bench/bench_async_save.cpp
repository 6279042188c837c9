// bench_async_save: what save_state blocks the training loop for, in a fresh process, so that
// the process's first save (whose host buffers are new memory) is seen as well as a later one.
// One measurement per process: bench/async_save.sh starts many, interleaved, and summarises.
//
// usage: bench_async_save async|sync|allocate|fault DIR
//   async:    two asynchronous saves of the benchmarks' ~300 MB state (the Large model with
//             Adam), each waited for before the next; prints {"mode", "first_ms",
//             "second_ms"}: the time each save_state call blocked the loop.
//   sync:     two synchronous saves; the same fields (each call's whole time).
//   allocate: no save; "first_ms" is the time to allocate host buffers of the state's sizes and
//             map them (accelerate::detail::populate_pages), as the first asynchronous save
//             does before copying; "second_ms" the copy of the state into them.
//   fault:    the same without mapping them first: the copy faults the pages in as it goes.
#include <accelerate/accelerate.hpp>

#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "large_model.hpp"

namespace {

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "async" && mode != "sync" && mode != "allocate" && mode != "fault") {
    std::cerr << "usage: bench_async_save async|sync|allocate|fault DIR\n";
    return 2;
  }
  const std::filesystem::path dir = argv[2];
  accelerate::Accelerator<> acc{{.cpu = true, .seed = 0}};
  accelerate::bench::Large net;
  torch::optim::Adam adam{net->parameters()};
  auto [model, opt] = acc.prepare(net, adam);
  acc.backward(model(torch::randn({2, 2048})).sum());
  opt.step();
  double ms[2] = {0, 0};
  if (mode == "allocate" || mode == "fault") {
    std::vector<at::Tensor> state, buffers;  // the parameters and Adam's two moments
    for (const auto& p : net->parameters()) {
      const auto& moments = static_cast<torch::optim::AdamParamState&>(*adam.state().at(p.unsafeGetTensorImpl()));
      state.insert(state.end(), {p.detach(), moments.exp_avg(), moments.exp_avg_sq()});
    }
    auto start = std::chrono::steady_clock::now();
    for (const auto& t : state) {
      buffers.push_back(at::empty(t.sizes(), t.options()));
      if (mode == "allocate") accelerate::detail::populate_pages(buffers.back().data_ptr(), buffers.back().nbytes());
    }
    ms[0] = milliseconds_since(start);
    start = std::chrono::steady_clock::now();
    for (std::size_t k = 0; k < state.size(); ++k) buffers[k].copy_(state[k]);
    ms[1] = milliseconds_since(start);
  } else {
    for (int k = 0; k < 2; ++k) {
      const auto start = std::chrono::steady_clock::now();
      acc.save_state(dir / ("state" + std::to_string(k)), {.asynchronous = mode == "async"});
      ms[k] = milliseconds_since(start);
      acc.wait_for_save();
    }
  }
  std::cout << "{\"mode\": \"" << mode << "\", \"first_ms\": " << ms[0] << ", \"second_ms\": " << ms[1] << "}"
            << std::endl;
  return 0;
}
