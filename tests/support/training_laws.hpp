// The training laws every engine that synchronises gradients obeys, through
// Accelerator<Backend> (the engine cases of engine_conformance.hpp test its primitives; these,
// what a user trains with): two steps on each rank's slice of a global batch equal one process
// on the whole batch, a save_state/load_state round trip resumes exactly, and get_state_dict is
// the whole model on every rank. Each law is written once for any Backend and world size; it
// throws on a broken law. tests/distributed/engine_conformance_test.cpp runs them.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include <accelerate/accelerate.hpp>

#include "models.hpp"

namespace accelerate::testing::laws {

// A broken law: thrown, so it fails a thread, this process or a worker process alike.
#define ACCELERATE_LAW(condition, what)                                                             \
  do {                                                                                              \
    if (!(condition))                                                                               \
      throw std::runtime_error(std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " + (what) + \
                               " (" #condition ")");                                                \
  } while (false)

inline AcceleratorOptions law_options() { return {.process_group = {.timeout = std::chrono::seconds(60)}}; }

// The global batch of step `step`: 4 rows per rank, the same on every rank.
inline std::pair<torch::Tensor, torch::Tensor> global_batch(int world, int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  return {torch::randn({4 * world, 8}, gen), torch::randn({4 * world, 4}, gen)};
}

// The model every law trains: the same initial values on every rank and in every reference.
inline TinyNet seeded_net() {
  torch::manual_seed(7);
  return TinyNet();
}

inline torch::optim::AdamWOptions adamw_options() { return torch::optim::AdamWOptions(0.01).weight_decay(0.1); }

// One step of `acc` on this rank's rows of the global batch of step `step`.
template <class Acc, class Model, class Optimizer>
void train_step(Acc& acc, Model& model, Optimizer& opt, int step) {
  const int world = acc.num_processes();
  const auto [x, y] = global_batch(world, step);
  const int64_t rows = 4;
  const auto mine = [&](const torch::Tensor& t) { return t.narrow(0, rows * acc.process_index(), rows); };
  acc.backward(torch::mse_loss(model(mine(x)), mine(y)));
  opt.step();
  opt.zero_grad();
}

// `state` holds exactly `module`'s parameters and buffers, whole, equal within `tolerance`.
inline void expect_whole_model(const std::map<std::string, at::Tensor>& state, const torch::nn::Module& module,
                               double tolerance, const std::string& what) {
  const auto params = module.named_parameters(true);
  const auto buffers = module.named_buffers(true);
  ACCELERATE_LAW(state.size() == params.size() + buffers.size(), what + ": every parameter and buffer, once");
  for (const auto* list : {&params, &buffers}) {
    for (const auto& item : *list) {
      const auto found = state.find(item.key());
      ACCELERATE_LAW(found != state.end(), what + ": " + item.key() + " is there");
      ACCELERATE_LAW(found->second.sizes() == item.value().sizes(), what + ": " + item.key() + " is whole");
      ACCELERATE_LAW(torch::allclose(found->second, item.value(), tolerance, tolerance),
                     what + ": " + item.key() + " has the expected values");
    }
  }
}

// Two AdamW steps, each rank on its rows of the global batch, equal (within float rounding)
// two steps of one process on the whole batch: the engine averages the gradients of every
// parameter, whatever it shards.
template <class Backend>
void two_steps_equal_one_process_on_the_global_batch(const std::filesystem::path&) {
  Accelerator<Backend> acc{law_options()};
  TinyNet net = seeded_net();
  TinyNet alone = seeded_net();
  torch::optim::AdamW adamw(net->parameters(), adamw_options());
  torch::optim::AdamW alone_adamw(alone->parameters(), adamw_options());
  auto [model, opt] = acc.prepare(net, adamw);
  for (int step = 0; step < 2; ++step) {
    train_step(acc, model, opt, step);
    const auto [x, y] = global_batch(acc.num_processes(), step);
    torch::mse_loss(alone(x), y).backward();
    alone_adamw.step();
    alone_adamw.zero_grad();
  }
  expect_whole_model(acc.get_state_dict(model), *alone, 1e-5, "after two steps");
}

// State saved after one step and loaded after a second gives the second step again, bit for bit.
template <class Backend>
void a_save_load_round_trip_resumes_exactly(const std::filesystem::path& dir) {
  Accelerator<Backend> acc{law_options()};
  TinyNet net = seeded_net();
  torch::optim::AdamW adamw(net->parameters(), adamw_options());
  auto [model, opt] = acc.prepare(net, adamw);
  train_step(acc, model, opt, 0);
  const auto saved = acc.save_state(dir / "round_trip");
  train_step(acc, model, opt, 1);
  std::map<std::string, at::Tensor> first;
  for (const auto& [name, tensor] : acc.get_state_dict(model)) first[name] = tensor.clone();
  acc.load_state(saved);
  train_step(acc, model, opt, 1);
  const auto again = acc.get_state_dict(model);
  ACCELERATE_LAW(again.size() == first.size(), "the same tensors after the round trip");
  for (const auto& [name, tensor] : first)
    ACCELERATE_LAW(again.count(name) && torch::equal(again.at(name), tensor), name + " is bitwise the same");
}

// get_state_dict is the whole model on every rank, right after prepare (rank 0's values).
template <class Backend>
void get_state_dict_is_the_whole_model(const std::filesystem::path&) {
  Accelerator<Backend> acc{law_options()};
  TinyNet net = seeded_net();
  TinyNet reference = seeded_net();
  auto [model] = acc.prepare(net);
  expect_whole_model(acc.get_state_dict(model), *reference, 0.0, "get_state_dict");
}

#define ACCELERATE_TRAINING_LAWS(X)                                                           \
  X(TwoStepsEqualOneProcessOnTheGlobalBatch, two_steps_equal_one_process_on_the_global_batch) \
  X(ASaveLoadRoundTripResumesExactly, a_save_load_round_trip_resumes_exactly)                 \
  X(GetStateDictIsTheWholeModel, get_state_dict_is_the_whole_model)

}  // namespace accelerate::testing::laws
