// Optimizer state as a StateDict, without pickle: per-parameter tensors (momentum, Adam
// moments) keyed "state.<i>.<name>", and step counts plus param-group hyperparameters in
// JSON, for torch::optim's SGD, Adam, AdamW, RMSprop, Adagrad and LBFGS. Parameters are
// numbered across param groups in order, as in PyTorch's optimizer.state_dict().
#pragma once

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate::checkpoint {

}  // namespace accelerate::checkpoint

namespace accelerate::detail {

// Field tables: each optimizer type's per-parameter tensors, per-parameter integers and
// hyperparameters, so that saving and loading read the same list.
template <class State>
struct ParamStateFields;

template <>
struct ParamStateFields<torch::optim::SGDParamState> {
  static constexpr const char* name = "SGD";
  template <class F> static void tensors(torch::optim::SGDParamState& s, F&& f) {
    f("momentum_buffer", [&]() -> const at::Tensor& { return s.momentum_buffer(); },
      [&](const at::Tensor& t) { s.momentum_buffer(t); });
  }
  template <class F> static void integers(torch::optim::SGDParamState&, F&&) {}
};

template <class S>
struct AdamLikeFields {
  template <class F> static void tensors(S& s, F&& f) {
    f("exp_avg", [&]() -> const at::Tensor& { return s.exp_avg(); }, [&](const at::Tensor& t) { s.exp_avg(t); });
    f("exp_avg_sq", [&]() -> const at::Tensor& { return s.exp_avg_sq(); },
      [&](const at::Tensor& t) { s.exp_avg_sq(t); });
    f("max_exp_avg_sq", [&]() -> const at::Tensor& { return s.max_exp_avg_sq(); },
      [&](const at::Tensor& t) { s.max_exp_avg_sq(t); });
  }
  template <class F> static void integers(S& s, F&& f) {
    f("step", [&] { return s.step(); }, [&](int64_t v) { s.step(v); });
  }
};
template <>
struct ParamStateFields<torch::optim::AdamParamState> : AdamLikeFields<torch::optim::AdamParamState> {
  static constexpr const char* name = "Adam";
};
template <>
struct ParamStateFields<torch::optim::AdamWParamState> : AdamLikeFields<torch::optim::AdamWParamState> {
  static constexpr const char* name = "AdamW";
};

template <>
struct ParamStateFields<torch::optim::RMSpropParamState> {
  static constexpr const char* name = "RMSprop";
  using S = torch::optim::RMSpropParamState;
  template <class F> static void tensors(S& s, F&& f) {
    f("square_avg", [&]() -> const at::Tensor& { return s.square_avg(); },
      [&](const at::Tensor& t) { s.square_avg(t); });
    f("momentum_buffer", [&]() -> const at::Tensor& { return s.momentum_buffer(); },
      [&](const at::Tensor& t) { s.momentum_buffer(t); });
    f("grad_avg", [&]() -> const at::Tensor& { return s.grad_avg(); }, [&](const at::Tensor& t) { s.grad_avg(t); });
  }
  template <class F> static void integers(S& s, F&& f) {
    f("step", [&] { return s.step(); }, [&](int64_t v) { s.step(v); });
  }
};

template <>
struct ParamStateFields<torch::optim::AdagradParamState> {
  static constexpr const char* name = "Adagrad";
  using S = torch::optim::AdagradParamState;
  template <class F> static void tensors(S& s, F&& f) {
    f("sum", [&]() -> const at::Tensor& { return s.sum(); }, [&](const at::Tensor& t) { s.sum(t); });
  }
  template <class F> static void integers(S& s, F&& f) {
    f("step", [&] { return s.step(); }, [&](int64_t v) { s.step(v); });
  }
};

/// Hyperparameters of one param group to JSON and back.
nlohmann::json options_to_json(const torch::optim::OptimizerOptions& options);

void options_from_json(torch::optim::OptimizerOptions& options, const nlohmann::json& j);

/// Calls `fn.template operator()<State>()` with the param-state type of a torch::optim SGD,
/// Adam, AdamW, RMSprop or Adagrad and returns true; returns false for any other optimizer.
template <class Fn>
bool try_with_state_type(const torch::optim::Optimizer& optimizer, Fn&& fn) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return fn.template operator()<torch::optim::SGDParamState>(), true;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return fn.template operator()<torch::optim::AdamParamState>(), true;
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return fn.template operator()<torch::optim::AdamWParamState>(), true;
  if (dynamic_cast<const torch::optim::RMSprop*>(&optimizer)) return fn.template operator()<torch::optim::RMSpropParamState>(), true;
  if (dynamic_cast<const torch::optim::Adagrad*>(&optimizer)) return fn.template operator()<torch::optim::AdagradParamState>(), true;
  return false;
}

/// Calls `fn.template operator()<State>()` with the param-state type this optimizer uses; an
/// optimizer without a built-in encoding is an error.
template <class Fn>
void with_state_type(const torch::optim::Optimizer& optimizer, Fn&& fn) {
  if (try_with_state_type(optimizer, std::forward<Fn>(fn))) return;
  accelerate::detail::fail("optimizer state: only torch::optim SGD, Adam, AdamW, RMSprop, Adagrad and LBFGS "
                           "have a built-in checkpoint encoding; give your optimizer state_dict() and "
                           "load_state_dict(const accelerate::StateDict&) members");
}

/// Each state records the names of the tensors saved with it ("tensors"); one of them missing
/// (a tensors file lost beside its JSON) is an error naming it, not an optimizer that resumes
/// without its moments.
void check_listed_tensors(const nlohmann::json& state, const StateDict& saved, const std::string& key);

/// LBFGS's encoding (one state for all parameters, a history of tensors): optimizer_state.hpp's
/// functions call these for a torch::optim::LBFGS.
StateDict lbfgs_state_dict(torch::optim::LBFGS& optimizer);
void check_lbfgs_state_dict(torch::optim::LBFGS& optimizer, const StateDict& saved);
void load_lbfgs_state_dict(torch::optim::LBFGS& optimizer, const StateDict& saved);

}  // namespace accelerate::detail

namespace accelerate::checkpoint {

/// The optimizer's state: `values` = {"type", "param_groups": [{hyperparameters, "params":
/// [indices]}], "state": {"<i>": {"step": n}}}, `tensors` = {"state.<i>.<name>": tensor}.
/// LBFGS keeps one state for all its parameters, under index 0: its counters and its last
/// step size and loss in JSON, its direction, last flat gradient and Hessian scale as tensors,
/// and its history as numbered tensors ("state.0.old_dirs.<k>", ...), PyTorch's fields.
StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer);

/// Finds every problem load_optimizer_state_dict would meet (another optimizer type, other
/// param groups or parameter counts, missing or ill-typed fields, a state tensor of another
/// shape) without changing the optimizer.
void check_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& saved);

/// Restores what optimizer_state_dict() produced into an optimizer built over the same
/// parameters in the same order. Tensors are copied to each parameter's device. Everything is
/// checked first (check_optimizer_state_dict), so a failure changes nothing.
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& saved);

}  // namespace accelerate::checkpoint

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/checkpoint/optimizer_state.ipp>
#endif
