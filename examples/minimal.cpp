// The README's example, whole: every policy slot filled, a plain LibTorch loop.
#include <accelerate/accelerate.hpp>

#include <torch/torch.h>

using Acc = accelerate::Accelerator<accelerate::Gloo, accelerate::Bf16,
                                    accelerate::Accumulate<4>, accelerate::ClipNorm<>>;

int main(int argc, char** argv) {
  return accelerate::launch(argc, argv, [](int, char**) {  // --nproc N starts N processes
    Acc acc{{.seed = 42, .clip = {.max_norm = 1.0},
             .project = {.project_dir = "minimal_run", .automatic_checkpoint_naming = true, .total_limit = 2}}};
    torch::nn::Sequential net(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 1));
    torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-2));
    torch::optim::StepLR scheduler(optimizer, /*step_size=*/20, /*gamma=*/0.5);
    auto inputs = torch::randn({2048, 16});
    auto data = accelerate::DataLoader(accelerate::data::TensorDataset(inputs, inputs.sum(1, true)),
                                       {.batch_size = 32, .shuffle = true});

    auto [model, opt, loader, sched] = acc.prepare(net, optimizer, data, scheduler);
    for (int epoch = 0; epoch < 3; ++epoch) {
      for (auto& [x, y] : loader) {
        auto step = acc.accumulate(model);            // no_sync on micro-steps, sync on boundary
        auto loss = torch::mse_loss(model(x), y);     // forward runs under bf16 autocast
        acc.backward(loss);                           // loss / 4, overlapped bucketed all-reduce
        opt.step(); sched.step(); opt.zero_grad();    // no-ops on non-sync micro-steps
      }
      acc.print("epoch", epoch, "last window's gradient norm", acc.last_grad_norm());
      acc.save_state();                               // minimal_run/checkpoints/checkpoint_<n>
    }
    acc.save_model(model, "minimal_run/model", {.max_shard_size = "1GB"});
    return 0;
  });
}
