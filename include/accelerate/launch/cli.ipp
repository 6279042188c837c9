// Bodies of cli.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/launch/cli.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE int parse_int(std::string_view flag, const std::string& text, int min, int max) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  ACCELERATE_CHECK(errno == 0 && end != text.c_str() && *end == '\0' && value >= min && value <= max,
                   "accelerate launch: ", flag, " needs an integer in [", min, ", ", max, "], got '",
                   text, "'");
  return static_cast<int>(value);
}

}  // namespace accelerate::detail

namespace accelerate {

ACCELERATE_INLINE LaunchOptions parse_launch_args(int& argc, char** argv) {
  LaunchOptions options;
  if (auto n = detail::env_string("ACCELERATE_NUM_PROCESSES"))
    options.nproc = detail::parse_int("ACCELERATE_NUM_PROCESSES", *n, 1, 4096);
  std::vector<char*> kept{argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    auto take = [&](std::string_view name) -> bool {
      if (arg == name) {
        ACCELERATE_CHECK(i + 1 < argc, "accelerate launch: ", name, " needs a value");
        value = argv[++i];
        return true;
      }
      if (arg.rfind(std::string(name) + "=", 0) == 0) {
        value = arg.substr(name.size() + 1);
        return true;
      }
      return false;
    };
    if (take("--nproc") || take("--nproc-per-node") || take("--num-processes"))
      options.nproc = detail::parse_int("--nproc", value, 1, 4096);
    else if (take("--nnodes")) options.nnodes = detail::parse_int("--nnodes", value, 1, 65536);
    else if (take("--node-rank")) options.node_rank = detail::parse_int("--node-rank", value, 0, 65535);
    else if (take("--master-addr")) options.master_addr = value;
    else if (take("--master-port")) options.master_port = detail::parse_int("--master-port", value, 1, 65535);
    else if (take("--max-restarts")) options.max_restarts = detail::parse_int("--max-restarts", value, 0, 1000000);
    else if (take("--min-nproc")) options.min_nproc = detail::parse_int("--min-nproc", value, 1, 4096);
    else kept.push_back(argv[i]);
  }
  ACCELERATE_CHECK(options.node_rank < options.nnodes, "accelerate launch: --node-rank ",
                   options.node_rank, " must be below --nnodes ", options.nnodes);
  ACCELERATE_CHECK(options.nnodes == 1 || options.master_port.has_value(),
                   "accelerate launch: --nnodes ", options.nnodes,
                   " needs --master-port (and --master-addr of node 0) on every node");
  ACCELERATE_CHECK(!options.min_nproc || *options.min_nproc <= options.nproc, "accelerate launch: --min-nproc ",
                   options.min_nproc.value_or(0), " is above --nproc ", options.nproc);
  ACCELERATE_CHECK(options.nnodes == 1 || (options.max_restarts == 0 && !options.min_nproc),
                   "accelerate launch: --max-restarts and --min-nproc restart a one-node job; with --nnodes ",
                   options.nnodes, " restart the job from your scheduler (each start resumes with load_state())");
  for (std::size_t k = 0; k < kept.size(); ++k) argv[k] = kept[k];
  argc = static_cast<int>(kept.size());
  argv[argc] = nullptr;
  return options;
}

}  // namespace accelerate
