// Bodies of process_group.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/distributed/process_group.hpp>

namespace accelerate::distributed {

ACCELERATE_INLINE void ReducerHandle::before_forward() {
  int root = 0;
  if (reducer_ && reducer_->join()) {
    const bool sync = reducer_->sync_enabled() && torch::autograd::GradMode::is_enabled();
    const auto notice = reducer_->join()->announce_forward(reducer_->join_index(), sync);
    reducer_->prepare_joined_round(notice.training_ranks, notice.sync);
    root = notice.buffer_root;
  }
  if (comm_ && !buffers_.empty()) broadcast_flat(*comm_, buffers_, root);
}

ACCELERATE_INLINE std::optional<checkpoint::Entry> ReducerHandle::checkpoint_entry(const std::string& name) const {
  if (!reducer_) return std::nullopt;
  const std::string key = "gradient_sync." + name;
  return checkpoint::Entry{checkpoint::Entry::Kind::gradient_sync, checkpoint::EntryOwner::every_rank,
                           [reducer = reducer_, key] {
                             StateDict state;
                             state.values[key] = reducer->layout_state();
                             for (auto& [name, tensor] : reducer->compression_state())
                               state.tensors[key + "." + name] = tensor;
                             return state;
                           },
                           [reducer = reducer_, key](const StateDict& state) {
                             if (!state.values.contains(key)) return;
                             const nlohmann::json& layout = state.values.at(key);
                             reducer->load_layout_state(layout);
                             std::map<std::string, at::Tensor> compression;
                             for (const auto& [name, tensor] : state.tensors)
                               if (name.rfind(key + ".", 0) == 0) compression[name.substr(key.size() + 1)] = tensor;
                             const int saved_world = layout.value("world_size", -1);  // -1: older checkpoint
                             reducer->load_compression_state(compression, saved_world);
                           }};
}

ACCELERATE_INLINE bool debug_mode_from_environment() {
  auto text = accelerate::detail::env_string("ACCELERATE_DEBUG_MODE");
  if (!text) return false;
  std::string value = *text;
  for (auto& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (value == "1" || value == "true" || value == "yes" || value == "y" || value == "on") return true;
  if (value == "0" || value == "false" || value == "no" || value == "n" || value == "off") return false;
  accelerate::detail::fail("environment variable ACCELERATE_DEBUG_MODE='", *text,
                           "' is not a boolean (1/true/yes or 0/false/no)");
}

ACCELERATE_INLINE compat::BackendPtr GlooFactory::create(compat::StorePtr store, const ProcessEnvironment& env,
                                                         const AcceleratorOptions& options) {
  const auto interface = accelerate::detail::env_string("GLOO_SOCKET_IFNAME").value_or("");
  const bool loopback = env.master_addr == "localhost" || env.master_addr.rfind("127.", 0) == 0;
  return compat::make_gloo_backend(std::move(store), env.rank, env.world_size, options.process_group.timeout,
                                   loopback ? "127.0.0.1" : "", interface);
}

}  // namespace accelerate::distributed
