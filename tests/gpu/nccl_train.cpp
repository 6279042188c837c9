// A program on the Nccl backend, compiled and linked on every machine (so the NCCL path cannot
// rot) and run where GPUs are lent:
//   nccl_train --version          prints NCCL's version (links libnccl; no GPU needed)
//   nccl_train --nproc N          trains on N GPUs with bf16 and accumulation; exits 77 (CTest's
//                                 skip code) when fewer than N CUDA devices are visible
//   nccl_train --nproc N --zero S the same on Zero<Nccl, S> (sharded, stage 1, 2 or 3)
#include <accelerate/accelerate.hpp>
#include <accelerate/distributed/nccl.hpp>

#include <torch/torch.h>

#include <cstring>
#include <iostream>
#include <string>

template <class Backend>
int train() {
  using Acc = accelerate::Accelerator<Backend, accelerate::Bf16, accelerate::Accumulate<2>, accelerate::ClipNorm<>>;
  Acc acc{{.seed = 0}};
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

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--version") == 0) {
    std::cout << "NCCL " << accelerate::distributed::nccl_version() << std::endl;
    return 0;
  }
  return accelerate::launch(argc, argv, [](int argc, char** argv) {
    const auto world = accelerate::distributed::detect_environment().world_size;
    if (!torch::cuda::is_available() || static_cast<int>(torch::cuda::device_count()) < world) {
      std::cout << "nccl_train: needs " << world << " CUDA device(s); skipping" << std::endl;
      return 77;
    }
    const std::string zero = argc > 2 && std::strcmp(argv[1], "--zero") == 0 ? argv[2] : "";
    if (zero == "1") return train<accelerate::Zero<accelerate::Nccl, 1>>();
    if (zero == "2") return train<accelerate::Zero<accelerate::Nccl, 2>>();
    if (zero == "3") return train<accelerate::Zero<accelerate::Nccl, 3>>();
    return train<accelerate::Nccl>();
  });
}
