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
  } else {
    options.set_lr(num("lr"));
  }
}

}  // namespace accelerate::detail

namespace accelerate::checkpoint {

ACCELERATE_INLINE StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer) {
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
        states[key] = scalar;
        Fields::tensors(*state, [&](const char* name, auto get, auto) {
          if (get().defined()) out.tensors["state." + key + "." + name] = get().detach();
        });
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
