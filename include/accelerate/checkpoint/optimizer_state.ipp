// Bodies of optimizer_state.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/checkpoint/optimizer_state.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE nlohmann::json options_to_json(const torch::optim::OptimizerOptions& options) {
  nlohmann::json j;
  if (auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    j = {{"lr", o->lr()}, {"momentum", o->momentum()}, {"dampening", o->dampening()},
         {"weight_decay", o->weight_decay()}, {"nesterov", o->nesterov()}};
  } else if (auto* a = dynamic_cast<const torch::optim::AdamOptions*>(&options)) {
    j = {{"lr", a->lr()}, {"betas", {std::get<0>(a->betas()), std::get<1>(a->betas())}},
         {"eps", a->eps()}, {"weight_decay", a->weight_decay()}, {"amsgrad", a->amsgrad()}};
  } else if (auto* w = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    j = {{"lr", w->lr()}, {"betas", {std::get<0>(w->betas()), std::get<1>(w->betas())}},
         {"eps", w->eps()}, {"weight_decay", w->weight_decay()}, {"amsgrad", w->amsgrad()}};
  } else if (auto* r = dynamic_cast<const torch::optim::RMSpropOptions*>(&options)) {
    j = {{"lr", r->lr()}, {"alpha", r->alpha()}, {"eps", r->eps()},
         {"weight_decay", r->weight_decay()}, {"momentum", r->momentum()}, {"centered", r->centered()}};
  } else if (auto* g = dynamic_cast<const torch::optim::AdagradOptions*>(&options)) {
    j = {{"lr", g->lr()}, {"lr_decay", g->lr_decay()}, {"weight_decay", g->weight_decay()},
         {"initial_accumulator_value", g->initial_accumulator_value()}, {"eps", g->eps()}};
  } else if (auto* l = dynamic_cast<const torch::optim::LBFGSOptions*>(&options)) {
    j = {{"lr", l->lr()}, {"max_iter", l->max_iter()}, {"max_eval", nullptr},
         {"tolerance_grad", l->tolerance_grad()}, {"tolerance_change", l->tolerance_change()},
         {"history_size", l->history_size()}, {"line_search_fn", nullptr}};
    if (l->max_eval()) j["max_eval"] = *l->max_eval();
    if (l->line_search_fn()) j["line_search_fn"] = *l->line_search_fn();
  } else {
    j = {{"lr", options.get_lr()}};  // any other optimizer: at least its learning rate
  }
  return j;
}

ACCELERATE_INLINE void options_from_json(torch::optim::OptimizerOptions& options, const nlohmann::json& j) {
  auto num = [&](const char* key) { return j.at(key).get<double>(); };
  if (auto* o = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
    o->lr(num("lr")).momentum(num("momentum")).dampening(num("dampening"))
        .weight_decay(num("weight_decay")).nesterov(j.at("nesterov").get<bool>());
  } else if (auto* a = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
    a->lr(num("lr")).betas({j.at("betas").at(0).get<double>(), j.at("betas").at(1).get<double>()})
        .eps(num("eps")).weight_decay(num("weight_decay")).amsgrad(j.at("amsgrad").get<bool>());
  } else if (auto* w = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
    w->lr(num("lr")).betas({j.at("betas").at(0).get<double>(), j.at("betas").at(1).get<double>()})
        .eps(num("eps")).weight_decay(num("weight_decay")).amsgrad(j.at("amsgrad").get<bool>());
  } else if (auto* r = dynamic_cast<torch::optim::RMSpropOptions*>(&options)) {
    r->lr(num("lr")).alpha(num("alpha")).eps(num("eps")).weight_decay(num("weight_decay"))
        .momentum(num("momentum")).centered(j.at("centered").get<bool>());
  } else if (auto* g = dynamic_cast<torch::optim::AdagradOptions*>(&options)) {
    g->lr(num("lr")).lr_decay(num("lr_decay")).weight_decay(num("weight_decay"))
        .initial_accumulator_value(num("initial_accumulator_value")).eps(num("eps"));
  } else if (auto* l = dynamic_cast<torch::optim::LBFGSOptions*>(&options)) {
    const auto& max_eval = j.at("max_eval");
    const auto& line_search = j.at("line_search_fn");
    l->lr(num("lr")).max_iter(j.at("max_iter").get<int64_t>()).tolerance_grad(num("tolerance_grad"))
        .tolerance_change(num("tolerance_change")).history_size(j.at("history_size").get<int64_t>());
    l->max_eval(max_eval.is_null() ? std::nullopt : std::optional<int64_t>(max_eval.get<int64_t>()));
    l->line_search_fn(line_search.is_null() ? std::nullopt : std::optional<std::string>(line_search.get<std::string>()));
  } else {
    options.set_lr(num("lr"));
  }
}

ACCELERATE_INLINE void check_listed_tensors(const nlohmann::json& state, const StateDict& saved, const std::string& key) {
  if (!state.contains("tensors")) return;  // saved before the list existed
  for (const auto& name : state.at("tensors")) {
    const std::string tensor = "state." + key + "." + name.get<std::string>();
    ACCELERATE_CHECK(saved.tensors.count(tensor) > 0, "optimizer state: ", tensor, " is missing (its state lists it; "
                     "the tensors file was lost or replaced?), so the optimizer would resume without it");
  }
}

// The history fields of LBFGSParamState, each a sequence of tensors.
template <class F>
void lbfgs_histories(torch::optim::LBFGSParamState& s, F&& f) {
  f("old_dirs", s.old_dirs());
  f("old_stps", s.old_stps());
  f("ro", s.ro());
}

ACCELERATE_INLINE StateDict lbfgs_state_dict(torch::optim::LBFGS& optimizer) {
  StateDict out;
  out.values["type"] = "LBFGS";
  auto& group = optimizer.param_groups().at(0);
  nlohmann::json g = options_to_json(group.options());
  nlohmann::json indices = nlohmann::json::array();
  for (std::size_t i = 0; i < group.params().size(); ++i) indices.push_back(i);
  g["params"] = indices;
  out.values["param_groups"] = nlohmann::json::array({g});
  out.values["state"] = nlohmann::json::object();
  const auto it = optimizer.state().find(group.params().at(0).unsafeGetTensorImpl());
  if (it == optimizer.state().end()) return out;
  auto& s = static_cast<torch::optim::LBFGSParamState&>(*it->second);
  nlohmann::json scalars = {{"func_evals", s.func_evals()}, {"n_iter", s.n_iter()}, {"t", s.t()},
                            {"prev_loss", s.prev_loss()}, {"history", s.old_dirs().size()}, {"al", nullptr}};
  scalars["tensors"] = nlohmann::json::array();
  const auto put = [&](const std::string& name, const at::Tensor& t) {
    if (!t.defined()) return;
    out.tensors["state.0." + name] = t.detach();
    scalars["tensors"].push_back(name);
  };
  put("d", s.d());
  put("H_diag", s.H_diag());
  put("prev_flat_grad", s.prev_flat_grad());
  lbfgs_histories(s, [&](const char* name, const std::deque<at::Tensor>& list) {
    for (std::size_t k = 0; k < list.size(); ++k) put(std::string(name) + "." + std::to_string(k), list[k]);
  });
  if (s.al()) {
    scalars["al"] = s.al()->size();
    for (std::size_t k = 0; k < s.al()->size(); ++k) put("al." + std::to_string(k), (*s.al())[k]);
  }
  out.values["state"]["0"] = scalars;
  return out;
}

ACCELERATE_INLINE void check_lbfgs_state_dict(torch::optim::LBFGS& optimizer, const StateDict& saved) {
  const auto type = saved.value<std::string>("type");
  ACCELERATE_CHECK(type == "LBFGS", "optimizer state: saved by a ", type, " optimizer, loading into a LBFGS");
  const auto& groups = saved.values.at("param_groups");
  const auto& states = saved.values.at("state");
  ACCELERATE_CHECK(groups.is_array() && groups.size() == 1 && states.is_object(),
                   "optimizer state: LBFGS has one param group; the saved state has ", groups.dump().substr(0, 200));
  auto& group = optimizer.param_groups().at(0);
  ACCELERATE_CHECK(groups[0].at("params").size() == group.params().size(), "optimizer state: LBFGS saved with ",
                   groups[0].at("params").size(), " parameters, the optimizer has ", group.params().size());
  auto trial = group.options().clone();
  options_from_json(*trial, groups[0]);
  if (!states.contains("0")) return;
  const auto& scalars = states.at("0");
  check_listed_tensors(scalars, saved, "0");
  for (const char* key : {"func_evals", "n_iter", "history"})
    ACCELERATE_CHECK(scalars.contains(key) && scalars.at(key).is_number_integer(), "optimizer state: LBFGS's ", key,
                     " is missing or not an integer");
  for (const char* key : {"t", "prev_loss"})
    ACCELERATE_CHECK(scalars.contains(key) && scalars.at(key).is_number(), "optimizer state: LBFGS's ", key,
                     " is missing or not a number");
  int64_t flat = 0;  // LBFGS's directions and gradients are all its parameters, flattened
  for (const auto& p : group.params()) flat += p.numel();
  const auto need = [&](const std::string& name, std::optional<int64_t> numel) {
    const auto it = saved.tensors.find("state.0." + name);
    ACCELERATE_CHECK(it != saved.tensors.end(), "optimizer state: LBFGS's state.0.", name, " is missing");
    ACCELERATE_CHECK(!numel || it->second.numel() == *numel, "optimizer state: LBFGS's state.0.", name, " has ",
                     it->second.numel(), " elements, the optimizer's parameters ", *numel);
  };
  const auto history = scalars.at("history").get<int64_t>();
  for (int64_t k = 0; k < history; ++k) {
    need("old_dirs." + std::to_string(k), flat);
    need("old_stps." + std::to_string(k), flat);
    need("ro." + std::to_string(k), std::nullopt);
  }
  if (scalars.contains("al") && !scalars.at("al").is_null())
    for (int64_t k = 0; k < scalars.at("al").get<int64_t>(); ++k) need("al." + std::to_string(k), std::nullopt);
  for (const char* name : {"d", "prev_flat_grad"}) {
    const auto it = saved.tensors.find(std::string("state.0.") + name);
    ACCELERATE_CHECK(it == saved.tensors.end() || it->second.numel() == flat, "optimizer state: LBFGS's state.0.",
                     name, " has ", it->second.numel(), " elements, the optimizer's parameters ", flat);
  }
}

ACCELERATE_INLINE void load_lbfgs_state_dict(torch::optim::LBFGS& optimizer, const StateDict& saved) {
  check_lbfgs_state_dict(optimizer, saved);
  auto& group = optimizer.param_groups().at(0);
  options_from_json(group.options(), saved.values.at("param_groups").at(0));
  auto* key = group.params().at(0).unsafeGetTensorImpl();
  const auto& states = saved.values.at("state");
  if (!states.contains("0")) {
    optimizer.state().erase(key);
    return;
  }
  const c10::Device device = group.params().at(0).device();
  const auto get = [&](const std::string& name) -> at::Tensor {
    const auto it = saved.tensors.find("state.0." + name);
    if (it == saved.tensors.end()) return {};
    return it->second.to(device, it->second.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  };
  const auto& scalars = states.at("0");
  auto s = std::make_unique<torch::optim::LBFGSParamState>();
  s->func_evals(scalars.at("func_evals").get<int64_t>()).n_iter(scalars.at("n_iter").get<int64_t>());
  s->t(scalars.at("t").get<double>()).prev_loss(scalars.at("prev_loss").get<double>());
  s->d(get("d")).H_diag(get("H_diag")).prev_flat_grad(get("prev_flat_grad"));
  const auto history = scalars.at("history").get<int64_t>();
  lbfgs_histories(*s, [&](const char* name, std::deque<at::Tensor>& list) {
    list.clear();
    for (int64_t k = 0; k < history; ++k) list.push_back(get(std::string(name) + "." + std::to_string(k)));
  });
  if (scalars.contains("al") && !scalars.at("al").is_null()) {
    std::vector<at::Tensor> al;
    for (int64_t k = 0; k < scalars.at("al").get<int64_t>(); ++k) al.push_back(get("al." + std::to_string(k)));
    s->al(std::move(al));
  }
  optimizer.state()[key] = std::move(s);
}

}  // namespace accelerate::detail

namespace accelerate::checkpoint {

ACCELERATE_INLINE StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer) {
  if (auto* lbfgs = dynamic_cast<torch::optim::LBFGS*>(&optimizer)) return detail::lbfgs_state_dict(*lbfgs);
  StateDict out;
  detail::with_state_type(optimizer, [&]<class State>() {
    using Fields = detail::ParamStateFields<State>;
    out.values["type"] = Fields::name;
    nlohmann::json groups = nlohmann::json::array();
    nlohmann::json states = nlohmann::json::object();
    std::size_t index = 0;
    for (auto& group : optimizer.param_groups()) {
      nlohmann::json g = detail::options_to_json(group.options());
      nlohmann::json indices = nlohmann::json::array();
      for (auto& p : group.params()) {
        const std::string key = std::to_string(index);
        indices.push_back(index++);
        auto it = optimizer.state().find(p.unsafeGetTensorImpl());
        if (it == optimizer.state().end()) continue;
        auto* state = dynamic_cast<State*>(it->second.get());
        ACCELERATE_CHECK(state != nullptr, "optimizer state: parameter ", key,
                         " has a state of an unexpected type for ", Fields::name);
        nlohmann::json scalar = nlohmann::json::object();
        Fields::integers(*state, [&](const char* name, auto get, auto) { scalar[name] = get(); });
        scalar["tensors"] = nlohmann::json::array();
        Fields::tensors(*state, [&](const char* name, auto get, auto) {
          if (!get().defined()) return;
          out.tensors["state." + key + "." + name] = get().detach();
          scalar["tensors"].push_back(name);
        });
        states[key] = scalar;
      }
      g["params"] = indices;
      groups.push_back(g);
    }
    out.values["param_groups"] = groups;
    out.values["state"] = states;
  });
  return out;
}

ACCELERATE_INLINE void check_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& saved) {
  if (auto* lbfgs = dynamic_cast<torch::optim::LBFGS*>(&optimizer)) return detail::check_lbfgs_state_dict(*lbfgs, saved);
  detail::with_state_type(optimizer, [&]<class State>() {
    using Fields = detail::ParamStateFields<State>;
    const auto type = saved.value<std::string>("type");
    ACCELERATE_CHECK(type == Fields::name, "optimizer state: saved by a ", type,
                     " optimizer, loading into a ", Fields::name);
    const auto& groups = saved.values.at("param_groups");
    const auto& states = saved.values.at("state");
    ACCELERATE_CHECK(groups.is_array() && states.is_object(), "optimizer state: param_groups or state is malformed");
    ACCELERATE_CHECK(groups.size() == optimizer.param_groups().size(), "optimizer state: ",
                     groups.size(), " param groups saved, the optimizer has ",
                     optimizer.param_groups().size());
    std::size_t index = 0;
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      auto& group = optimizer.param_groups()[gi];
      ACCELERATE_CHECK(groups[gi].at("params").size() == group.params().size(),
                       "optimizer state: param group ", gi, " saved with ",
                       groups[gi].at("params").size(), " parameters, the optimizer has ",
                       group.params().size());
      // The hyperparameters read into a copy of the group's options.
      auto trial = group.options().clone();
      detail::options_from_json(*trial, groups[gi]);
      for (auto& p : group.params()) {
        const std::string key = std::to_string(index++);
        if (!states.contains(key)) continue;
        detail::check_listed_tensors(states.at(key), saved, key);
        State scratch;
        Fields::integers(scratch, [&](const char* name, auto, auto set) {
          set(states.at(key).at(name).template get<int64_t>());
        });
        Fields::tensors(scratch, [&](const char* name, auto, auto) {
          const auto it = saved.tensors.find("state." + key + "." + name);
          if (it == saved.tensors.end()) return;
          ACCELERATE_CHECK(it->second.sizes() == p.sizes(), "optimizer state: state.", key, ".",
                           name, " has shape ", it->second.sizes(), " but parameter ", key,
                           " has shape ", p.sizes());
        });
      }
    }
  });
}

ACCELERATE_INLINE void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& saved) {
  if (auto* lbfgs = dynamic_cast<torch::optim::LBFGS*>(&optimizer)) return detail::load_lbfgs_state_dict(*lbfgs, saved);
  check_optimizer_state_dict(optimizer, saved);
  detail::with_state_type(optimizer, [&]<class State>() {
    using Fields = detail::ParamStateFields<State>;
    const auto& groups = saved.values.at("param_groups");
    const auto& states = saved.values.at("state");
    std::size_t index = 0;
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      auto& group = optimizer.param_groups()[gi];
      detail::options_from_json(group.options(), groups[gi]);
      for (auto& p : group.params()) {
        const std::string key = std::to_string(index++);
        if (!states.contains(key)) {
          optimizer.state().erase(p.unsafeGetTensorImpl());
          continue;
        }
        auto state = std::make_unique<State>();
        Fields::integers(*state, [&](const char* name, auto, auto set) {
          set(states.at(key).at(name).template get<int64_t>());
        });
        Fields::tensors(*state, [&](const char* name, auto, auto set) {
          const auto it = saved.tensors.find("state." + key + "." + name);
          if (it == saved.tensors.end()) return;
          set(it->second.to(p.device(), it->second.scalar_type(), /*non_blocking=*/false,
                            /*copy=*/true));
        });
        optimizer.state()[p.unsafeGetTensorImpl()] = std::move(state);
      }
    }
  });
}

}  // namespace accelerate::checkpoint
