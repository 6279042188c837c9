// A trainer compiled with ACCELERATE_SEPARATE_COMPILATION: its translation unit sees the
// library's declarations only and links against implementation.cpp. Two processes train with
// every policy slot filled, save and restore their state, and write and read the model.
#include <accelerate/accelerate.hpp>

#include <torch/torch.h>

#include <filesystem>

using Acc = accelerate::Accelerator<accelerate::Gloo, accelerate::Bf16, accelerate::Accumulate<2>,
                                    accelerate::ClipNorm<>>;

int main(int argc, char** argv) {
  return accelerate::launch(argc, argv, [](int, char**) {
    Acc acc{{.seed = 0, .clip = {.max_norm = 1.0}, .project = {.project_dir = "separate_run", .automatic_checkpoint_naming = true}}};
    torch::nn::Sequential net(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 1));
    torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-2));
    torch::optim::StepLR scheduler(optimizer, /*step_size=*/10, /*gamma=*/0.5);
    const auto inputs = torch::randn({256, 8});
    auto data = accelerate::DataLoader(accelerate::data::TensorDataset(inputs, inputs.sum(1, true)),
                                       {.batch_size = 16, .shuffle = true});
    auto [model, opt, loader, sched] = acc.prepare(net, optimizer, data, scheduler);

    double first = 0, last = 0;
    for (int epoch = 0; epoch < 3; ++epoch) {
      for (auto& [x, y] : loader) {
        auto step = acc.accumulate(model);
        auto loss = torch::mse_loss(model(x), y);
        acc.backward(loss);
        opt.step(); sched.step(); opt.zero_grad();
        (first == 0 ? first : last) = loss.item<double>();
      }
    }
    const auto saved = acc.save_state();
    const auto trained = acc.unwrap_model(model)->parameters();
    std::vector<at::Tensor> expected;
    for (const auto& p : trained) expected.push_back(p.detach().clone());
    {
      torch::NoGradGuard no_grad;
      for (auto& p : trained) p.add_(1.0);
    }
    acc.load_state(saved);
    for (std::size_t i = 0; i < expected.size(); ++i)
      if (!torch::equal(trained[i], expected[i])) {
        acc.print("consumer: load_state did not restore parameter", i);
        return 1;
      }

    acc.save_model(model, "separate_run/model", {.max_shard_size = std::uint64_t{600}});  // two shards and an index
    torch::nn::Sequential fresh(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 1));
    accelerate::checkpoint::load_checkpoint_in_model(*fresh, "separate_run/model");
    const auto loaded = fresh->parameters();
    for (std::size_t i = 0; i < expected.size(); ++i)
      if (!torch::equal(loaded[i], expected[i])) {
        acc.print("consumer: save_model and load_checkpoint_in_model disagree on parameter", i);
        return 1;
      }
    acc.print("consumer: loss", first, "->", last, "on", acc.num_processes(), "processes; state and model round-trip");
    return last < first ? 0 : 1;
  });
}
