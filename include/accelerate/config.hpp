// Reading a RunConfig from a YAML file with the keys of Accelerate's default_config.yaml
// (link accelerate::yaml_config, which adds yaml-cpp).
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include <accelerate/detail/check.hpp>
#include <accelerate/presets.hpp>

namespace accelerate {

namespace detail {

/// Keys this library acts on.
inline constexpr std::array<std::string_view, 8> used_keys = {
    "distributed_type", "mixed_precision", "num_processes", "gradient_accumulation_steps",
    "max_grad_norm", "clip_value", "use_cpu", "deepspeed_config"};
/// Keys of `accelerate config` files that are accepted and have no effect here (launch-time or
/// GPU/TPU/cloud settings handled by the launcher or not applicable to LibTorch).
inline constexpr std::array<std::string_view, 17> accepted_keys = {
    "compute_environment", "debug", "downcast_bf16", "enable_cpu_affinity", "gpu_ids",
    "machine_rank", "main_process_ip", "main_process_port", "main_training_function",
    "num_machines", "rdzv_backend", "same_network", "tpu_env", "tpu_use_cluster",
    "tpu_use_sudo", "dynamo_config", "mpirun_config"};
/// Keys of deepspeed_config this library acts on (the ZeRO stage selects Zero<Transport, stage>),
/// and those it accepts with no effect. Offloading is not implemented: only "none" is accepted.
inline constexpr std::array<std::string_view, 5> deepspeed_used_keys = {
    "zero_stage", "gradient_accumulation_steps", "gradient_clipping", "offload_optimizer_device",
    "offload_param_device"};
inline constexpr std::array<std::string_view, 3> deepspeed_accepted_keys = {
    "deepspeed_multinode_launcher", "zero3_init_flag", "zero3_save_16bit_model"};

/// "a, b, c": every key of `used` and `accepted`.
template <std::size_t U, std::size_t A>
std::string valid_keys(const std::array<std::string_view, U>& used, const std::array<std::string_view, A>& accepted) {
  std::string out;
  for (auto k : used) (out += out.empty() ? "" : ", ") += k;
  for (auto k : accepted) (out += ", ") += k;
  return out;
}

template <std::size_t N>
bool listed(const std::array<std::string_view, N>& keys, const std::string& key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

template <class T>
T read(const YAML::Node& node, const std::string& key, const std::string& file) {
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    const char* kind = std::is_same_v<T, std::string> ? "string" : std::is_same_v<T, bool> ? "boolean" : "number";
    detail::fail("config ", file, ": key '", key, "' has value '", YAML::Dump(node), "', which is not a valid ", kind);
  }
}

inline void check_value(const std::string& file, const std::string& key, const std::string& value,
                        std::initializer_list<std::string_view> valid) {
  if (std::find(valid.begin(), valid.end(), value) != valid.end()) return;
  std::string options;
  for (auto v : valid) (options += options.empty() ? "" : ", ") += v;
  detail::fail("config ", file, ": ", key, " is '", value, "'; valid values: ", options);
}

}  // namespace detail

/// Reads `path` (an `accelerate config` YAML file). Unknown keys, and unknown values of the
/// keys used here, are errors listing the valid ones. `distributed_type: DEEPSPEED` with
/// `deepspeed_config: {zero_stage: N}` asks for ZeRO stage N over NCCL, or over Gloo with
/// `use_cpu: true` (RunConfig::zero_stage; dispatch() then selects Zero<Nccl|Gloo, N>); its
/// gradient_accumulation_steps and gradient_clipping are read as the top-level keys.
/// Example:
///   auto config = accelerate::load_run_config("default_config.yaml").with_environment();
inline RunConfig load_run_config(const std::filesystem::path& path) {
  using namespace detail;
  const std::string file = path.string();
  YAML::Node root;
  try {
    root = YAML::LoadFile(file);
  } catch (const YAML::Exception& e) {
    detail::fail("config ", file, ": cannot read it as YAML: ", e.what());
  }
  RunConfig config;
  if (root.IsNull()) return config;
  ACCELERATE_CHECK(root.IsMap(), "config ", file, ": expected a mapping of keys to values");
  bool use_cpu = false;
  bool deepspeed = false;
  std::optional<YAML::Node> deepspeed_config;  // (a YAML::Node assigned to refers, not copies)
  auto accumulation_steps = [&](const YAML::Node& value, const std::string& key) {
    const auto v = read<long>(value, key, file);
    ACCELERATE_CHECK(v >= 1, "config ", file, ": ", key, " must be >= 1, got ", v);
    ACCELERATE_CHECK(config.gradient_accumulation_steps == 1 || config.gradient_accumulation_steps == static_cast<std::size_t>(v),
                     "config ", file, ": ", key, " is ", v, " but gradient_accumulation_steps is ",
                     config.gradient_accumulation_steps, " elsewhere in the file");
    config.gradient_accumulation_steps = static_cast<std::size_t>(v);
  };
  auto grad_norm = [&](const YAML::Node& value, const std::string& key) {
    const auto v = read<double>(value, key, file);
    ACCELERATE_CHECK(v > 0, "config ", file, ": ", key, " must be > 0, got ", v);
    config.max_grad_norm = v;
  };
  for (const auto& item : root) {
    const auto key = item.first.as<std::string>();
    ACCELERATE_CHECK(listed(used_keys, key) || listed(accepted_keys, key), "config ", file, ": unknown key '",
                     key, "'; valid keys: ", valid_keys(used_keys, accepted_keys));
    const YAML::Node& value = item.second;
    if (key == "distributed_type") {
      const auto v = read<std::string>(value, key, file);
      check_value(file, key, v, {"NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED"});
      if (v == "DEEPSPEED") deepspeed = true;
      else config.distributed_type = v;
    } else if (key == "mixed_precision") {
      const auto v = read<std::string>(value, key, file);
      check_value(file, key, v, {"no", "bf16", "fp16"});
      config.mixed_precision = v;
    } else if (key == "num_processes") {
      const auto v = read<int>(value, key, file);
      ACCELERATE_CHECK(v >= 1, "config ", file, ": num_processes must be >= 1, got ", v);
      config.num_processes = v;
    } else if (key == "gradient_accumulation_steps") {
      accumulation_steps(value, key);
    } else if (key == "max_grad_norm") {
      grad_norm(value, key);
    } else if (key == "clip_value") {
      const auto v = read<double>(value, key, file);
      ACCELERATE_CHECK(v > 0, "config ", file, ": clip_value must be > 0, got ", v);
      config.clip_value = v;
    } else if (key == "use_cpu") {
      use_cpu = read<bool>(value, key, file);
    } else if (key == "deepspeed_config") {
      ACCELERATE_CHECK(value.IsMap(), "config ", file, ": deepspeed_config must be a mapping of keys to values");
      deepspeed_config.emplace(value);
    }
  }
  if (deepspeed_config) {
    ACCELERATE_CHECK(deepspeed, "config ", file, ": deepspeed_config is read only with distributed_type: DEEPSPEED");
    for (const auto& item : *deepspeed_config) {
      const auto key = item.first.as<std::string>();
      const std::string where = "deepspeed_config." + key;
      ACCELERATE_CHECK(listed(deepspeed_used_keys, key) || listed(deepspeed_accepted_keys, key), "config ", file,
                       ": unknown key '", where, "'; valid keys of deepspeed_config: ",
                       valid_keys(deepspeed_used_keys, deepspeed_accepted_keys));
      const YAML::Node& value = item.second;
      if (key == "zero_stage") {
        const auto v = read<int>(value, where, file);
        ACCELERATE_CHECK(v >= 0 && v <= 3, "config ", file, ": ", where, " is ", v, "; valid values: 0, 1, 2, 3");
        config.zero_stage = v;
      } else if (key == "gradient_accumulation_steps") {
        accumulation_steps(value, where);
      } else if (key == "gradient_clipping") {
        grad_norm(value, where);
      } else if (key == "offload_optimizer_device" || key == "offload_param_device") {
        check_value(file, where, read<std::string>(value, where, file), {"none"});
      }
    }
  }
  if (deepspeed) {
    ACCELERATE_CHECK(config.zero_stage.has_value(), "config ", file,
                     ": distributed_type DEEPSPEED needs deepspeed_config.zero_stage (0, 1, 2 or 3)");
    config.distributed_type = use_cpu ? "MULTI_CPU" : "MULTI_GPU";
  }
  return config;
}

}  // namespace accelerate
