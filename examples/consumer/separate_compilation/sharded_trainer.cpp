// A ZeRO stage 3 trainer compiled with ACCELERATE_SEPARATE_COMPILATION: the sharded engine's
// bodies (ShardedCore) come from implementation.cpp, compiled once with the rest of the library.
// Two processes train a Sequential unit by unit, round-trip save_state/load_state and write the
// whole model with save_model from their slices.
#include <accelerate/accelerate.hpp>
#include <accelerate/distributed/sharded.hpp>

#include <torch/torch.h>

#include <map>
#include <string>

using Acc = accelerate::Accelerator<accelerate::Zero<accelerate::Gloo, 3>, accelerate::Fp32,
                                    accelerate::NoAccumulation, accelerate::ClipNorm<>>;

int main(int argc, char** argv) {
  return accelerate::launch(argc, argv, [](int, char**) {
    Acc acc{{.seed = 0, .clip = {.max_norm = 1.0}, .project = {.project_dir = "sharded_run", .automatic_checkpoint_naming = true}}};
    torch::nn::Sequential net(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 1));
    torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-2));
    const auto inputs = torch::randn({256, 8});
    auto data = accelerate::DataLoader(accelerate::data::TensorDataset(inputs, inputs.sum(1, true)),
                                       {.batch_size = 16, .shuffle = true});
    auto [model, opt, loader] = acc.prepare(net, optimizer, data);

    double first = 0, last = 0;
    for (int epoch = 0; epoch < 3; ++epoch) {
      for (auto& [x, y] : loader) {
        auto loss = torch::mse_loss(model(x), y);
        acc.backward(loss);
        opt.step(); opt.zero_grad();
        (first == 0 ? first : last) = loss.item<double>();
      }
    }
    const std::map<std::string, at::Tensor> trained = acc.get_state_dict(model);  // gathered
    const auto saved = acc.save_state();
    for (auto& [x, y] : loader) {  // one more epoch moves every slice
      acc.backward(torch::mse_loss(model(x), y));
      opt.step(); opt.zero_grad();
    }
    acc.load_state(saved);
    for (const auto& [name, tensor] : acc.get_state_dict(model))
      if (!torch::equal(tensor, trained.at(name))) {
        acc.print("sharded consumer: load_state did not restore", name);
        return 1;
      }

    acc.save_model(model, "sharded_run/model", {.max_shard_size = std::uint64_t{600}});  // streamed from the slices
    acc.wait_for_everyone();
    torch::nn::Sequential fresh(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 1));
    accelerate::checkpoint::load_checkpoint_in_model(*fresh, "sharded_run/model");
    for (const auto& item : fresh->named_parameters())
      if (!torch::equal(item.value(), trained.at(item.key()))) {
        acc.print("sharded consumer: save_model and get_state_dict disagree on", item.key());
        return 1;
      }
    acc.print("sharded consumer: loss", first, "->", last, "on", acc.num_processes(), "processes; state and model round-trip");
    return last < first ? 0 : 1;
  });
}
