// Reading a RunConfig from a YAML file with the keys of Accelerate's default_config.yaml
// (link accelerate::yaml_config, which adds yaml-cpp).
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <string>
#include <string_view>

#include <accelerate/detail/check.hpp>
#include <accelerate/presets.hpp>

namespace accelerate {

namespace detail {

/// Keys this library acts on.
inline constexpr std::array<std::string_view, 5> used_keys = {
    "distributed_type", "mixed_precision", "num_processes", "gradient_accumulation_steps",
    "max_grad_norm"};
/// Keys of `accelerate config` files that are accepted and have no effect here (launch-time or
/// GPU/TPU/cloud settings handled by the launcher or not applicable to LibTorch).
inline constexpr std::array<std::string_view, 18> accepted_keys = {
    "compute_environment", "debug", "downcast_bf16", "enable_cpu_affinity", "gpu_ids",
    "machine_rank", "main_process_ip", "main_process_port", "main_training_function",
    "num_machines", "rdzv_backend", "same_network", "tpu_env", "tpu_use_cluster",
    "tpu_use_sudo", "use_cpu", "dynamo_config", "mpirun_config"};

/// "a, b, c": every key a config file may hold.
inline std::string valid_keys() {
  std::string out;
  for (auto k : used_keys) (out += out.empty() ? "" : ", ") += k;
  for (auto k : accepted_keys) (out += ", ") += k;
  return out;
}

template <class T>
T read(const YAML::Node& node, const std::string& key, const std::string& file) {
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    detail::fail("config ", file, ": key '", key, "' has value '", YAML::Dump(node),
                 "', which is not a valid ", std::is_same_v<T, std::string> ? "string" : "number");
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
/// keys used here, are errors listing the valid ones.
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
  for (const auto& item : root) {
    const auto key = item.first.as<std::string>();
    const bool used = std::find(used_keys.begin(), used_keys.end(), key) != used_keys.end();
    const bool accepted = std::find(accepted_keys.begin(), accepted_keys.end(), key) != accepted_keys.end();
    ACCELERATE_CHECK(used || accepted, "config ", file, ": unknown key '", key, "'; valid keys: ",
                     valid_keys());
    const YAML::Node& value = item.second;
    if (key == "distributed_type") {
      const auto v = read<std::string>(value, key, file);
      check_value(file, key, v, {"NO", "MULTI_CPU", "MULTI_GPU"});
      config.distributed_type = v;
    } else if (key == "mixed_precision") {
      const auto v = read<std::string>(value, key, file);
      check_value(file, key, v, {"no", "bf16", "fp16"});
      config.mixed_precision = v;
    } else if (key == "num_processes") {
      const auto v = read<int>(value, key, file);
      ACCELERATE_CHECK(v >= 1, "config ", file, ": num_processes must be >= 1, got ", v);
      config.num_processes = v;
    } else if (key == "gradient_accumulation_steps") {
      const auto v = read<long>(value, key, file);
      ACCELERATE_CHECK(v >= 1, "config ", file, ": gradient_accumulation_steps must be >= 1, got ", v);
      config.gradient_accumulation_steps = static_cast<std::size_t>(v);
    } else if (key == "max_grad_norm") {
      const auto v = read<double>(value, key, file);
      ACCELERATE_CHECK(v > 0, "config ", file, ": max_grad_norm must be > 0, got ", v);
      config.max_grad_norm = v;
    }
  }
  return config;
}

}  // namespace accelerate
