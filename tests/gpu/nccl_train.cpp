// A program on the Nccl backend, compiled and linked on every machine (so the NCCL path cannot
// rot) and run where GPUs are lent:
//   nccl_train --version          prints NCCL's version (links libnccl; no GPU needed)
//   nccl_train --nproc N          trains on N GPUs with bf16 and accumulation; exits 77 (CTest's
//                                 skip code) when fewer than N CUDA devices are visible
//   nccl_train --nproc N --zero S the same on Zero<Nccl, S> (sharded, stage 1, 2 or 3)
//   nccl_train --nproc N --conformance nccl|zero1|zero2|zero3
//                                 the engine conformance cases (tests/support) on that NCCL
//                                 engine, one process per GPU; N = 1 runs on a one-GPU machine
//   nccl_train --nproc N --conformance gloo
//                                 the same runner on Gloo's engine, on the CPU: checks the
//                                 runner itself where no GPU is lent
#include <accelerate/accelerate.hpp>
#include <accelerate/distributed/nccl.hpp>
#include <accelerate/distributed/sharded.hpp>

#include <torch/torch.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "../support/engine_conformance.hpp"

// A collective that never completes fails the run within a minute, not the default 30.
constexpr auto collective_timeout = std::chrono::seconds(60);

template <class Backend>
int train() {
  using Acc = accelerate::Accelerator<Backend, accelerate::Bf16, accelerate::Accumulate<2>, accelerate::ClipNorm<>>;
  Acc acc{{.seed = 0, .process_group = {.timeout = collective_timeout}}};
  torch::nn::Sequential net(torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 4));
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto x = torch::randn({512, 32});
  auto data = accelerate::DataLoader(accelerate::data::TensorDataset(x, x.narrow(1, 0, 4)), {.batch_size = 16, .shuffle = true});
  auto [model, opt, loader] = acc.prepare(net, adamw, data);
  for (auto& [bx, by] : loader) {
    auto step = acc.accumulate(model);
    acc.backward(torch::mse_loss(model(bx), by));
    opt.step();
    opt.zero_grad();
  }
  // Parameters must be identical on every rank after synchronised steps (get_state_dict:
  // stage 3 keeps none whole between steps).
  const auto state = acc.get_state_dict(model);
  auto flat = torch::cat({state.at("0.weight").reshape(-1), state.at("2.weight").reshape(-1)});
  const auto all = acc.gather(flat.unsqueeze(0));
  const bool same = torch::equal(all[0], all[all.size(0) - 1]);
  acc.print("nccl_train: world", acc.num_processes(), "device", acc.device(), "rounds",
            acc.stats().grad_sync_rounds, same ? "parameters identical" : "PARAMETERS DIFFER");
  return same ? 0 : 1;
}

// Runs every conformance case on one engine of this process; a failing case is reported with
// its message and the others still run (a rank stuck in a collective after another rank
// failed gives up after the group's timeout).
template <class Engine>
int run_conformance(const std::string& kind) {
  namespace conformance = accelerate::testing::conformance;
  Engine engine(accelerate::AcceleratorOptions{.process_group = {.timeout = collective_timeout}}, "conformance");
  int cases = 0, failures = 0;
  auto run = [&](const char* name, auto&& body) {
    ++cases;
    try {
      body(engine);
    } catch (const std::exception& e) {
      ++failures;
      std::cerr << "conformance: " << kind << " rank " << engine.rank() << " fails " << name << ": " << e.what()
                << std::endl;
    }
  };
#define ACCELERATE_RUN_CASE(Test, function) run(#Test, [](auto& e) { conformance::function(e); });
  ACCELERATE_CONFORMANCE_CASES(ACCELERATE_RUN_CASE)
#undef ACCELERATE_RUN_CASE
  std::cout << "conformance: " << kind << " rank " << engine.rank() << " of " << engine.world_size() << " on "
            << engine.collective_device() << ": " << (cases - failures) << " of " << cases << " cases pass"
            << std::endl;
  return failures == 0 && cases > 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--version") == 0) {
    std::cout << "NCCL " << accelerate::distributed::nccl_version() << std::endl;
    return 0;
  }
  return accelerate::launch(argc, argv, [](int argc, char** argv) {
    namespace dist = accelerate::distributed;
    const bool conformance = argc > 2 && std::strcmp(argv[1], "--conformance") == 0;
    if (conformance && std::strcmp(argv[2], "gloo") == 0)
      return run_conformance<dist::ProcessGroupEngine<dist::GlooFactory>>("gloo");
    const auto world = accelerate::distributed::detect_environment().world_size;
    if (!torch::cuda::is_available() || static_cast<int>(torch::cuda::device_count()) < world) {
      std::cout << "nccl_train: needs " << world << " CUDA device(s); skipping" << std::endl;
      return 77;
    }
    if (conformance) {
      const std::string kind = argv[2];
      if (kind == "nccl") return run_conformance<dist::ProcessGroupEngine<dist::NcclFactory>>(kind);
      if (kind == "zero1") return run_conformance<dist::ShardedEngine<dist::NcclFactory, 1>>(kind);
      if (kind == "zero2") return run_conformance<dist::ShardedEngine<dist::NcclFactory, 2>>(kind);
      if (kind == "zero3") return run_conformance<dist::ShardedEngine<dist::NcclFactory, 3>>(kind);
      std::cerr << "nccl_train: --conformance takes nccl, zero1, zero2, zero3 or gloo, not " << kind << std::endl;
      return 2;
    }
    const std::string zero = argc > 2 && std::strcmp(argv[1], "--zero") == 0 ? argv[2] : "";
    if (zero == "1") return train<accelerate::Zero<accelerate::Nccl, 1>>();
    if (zero == "2") return train<accelerate::Zero<accelerate::Nccl, 2>>();
    if (zero == "3") return train<accelerate::Zero<accelerate::Nccl, 3>>();
    return train<accelerate::Nccl>();
  });
}
