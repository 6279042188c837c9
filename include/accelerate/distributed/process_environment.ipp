// Bodies of process_environment.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/distributed/process_environment.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE int require_int(const char* name, const char* launcher) {
  const auto value = accelerate::detail::env_int(name);
  ACCELERATE_CHECK(value.has_value(), "distributed environment: ", launcher,
                   " variables are partly set but ", name,
                   " is missing (set it, or unset the others to run one process)");
  return static_cast<int>(*value);
}

ACCELERATE_INLINE std::string first_slurm_host(const std::string& list) {
  std::string host;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (c == ',') break;
    if (c == '[') {
      std::size_t j = i + 1;
      while (j < list.size() && std::isdigit(static_cast<unsigned char>(list[j]))) host += list[j++];
      break;
    }
    host += c;
  }
  return host;
}

ACCELERATE_INLINE int first_slurm_count(const std::string& spec) {
  int value = 0;
  for (const char c : spec) {
    if (!std::isdigit(static_cast<unsigned char>(c))) break;
    value = value * 10 + (c - '0');
  }
  return value;
}

}  // namespace accelerate::detail

namespace accelerate::distributed {

ACCELERATE_INLINE ProcessEnvironment detect_environment() {
  using accelerate::detail::env_int;
  using accelerate::detail::env_string;
  ProcessEnvironment env;
  if (env_string("RANK") || env_string("WORLD_SIZE") || env_string("LOCAL_RANK")) {
    env.source = "torchrun";
    env.rank = detail::require_int("RANK", "torchrun-style");
    env.world_size = detail::require_int("WORLD_SIZE", "torchrun-style");
    env.local_rank = detail::require_int("LOCAL_RANK", "torchrun-style");
    env.local_world_size = static_cast<int>(env_int("LOCAL_WORLD_SIZE").value_or(env.world_size));
    const auto addr = env_string("MASTER_ADDR");
    ACCELERATE_CHECK(addr.has_value(), "distributed environment: RANK and WORLD_SIZE are set but "
                     "MASTER_ADDR is missing (the address of rank 0's host)");
    env.master_addr = *addr;
    env.master_port = detail::require_int("MASTER_PORT", "torchrun-style");
  } else if (env_string("OMPI_COMM_WORLD_RANK") || env_string("OMPI_COMM_WORLD_SIZE")) {
    env.source = "openmpi";
    env.rank = detail::require_int("OMPI_COMM_WORLD_RANK", "Open MPI");
    env.world_size = detail::require_int("OMPI_COMM_WORLD_SIZE", "Open MPI");
    env.local_rank = detail::require_int("OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI");
    env.local_world_size = detail::require_int("OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI");
    const auto addr = env_string("MASTER_ADDR");
    ACCELERATE_CHECK(addr.has_value(), "distributed environment: started by mpirun but MASTER_ADDR is "
                     "missing; pass it with mpirun -x MASTER_ADDR=<rank 0 host> -x MASTER_PORT=<port>");
    env.master_addr = *addr;
    env.master_port = detail::require_int("MASTER_PORT", "Open MPI (mpirun -x MASTER_PORT=...)");
  } else if (env_string("SLURM_PROCID") && env_string("SLURM_STEP_NUM_TASKS")) {
    // SLURM_STEP_NUM_TASKS is set by srun only, so a batch script itself is one process.
    env.source = "slurm";
    env.rank = detail::require_int("SLURM_PROCID", "SLURM");
    env.world_size = detail::require_int("SLURM_STEP_NUM_TASKS", "SLURM");
    env.local_rank = detail::require_int("SLURM_LOCALID", "SLURM");
    const auto per_node = env_string("SLURM_STEP_TASKS_PER_NODE");
    env.local_world_size = per_node ? detail::first_slurm_count(*per_node) : env.world_size;
    if (auto addr = env_string("MASTER_ADDR")) {
      env.master_addr = *addr;
    } else {
      const auto nodes = env_string("SLURM_STEP_NODELIST") ? env_string("SLURM_STEP_NODELIST")
                                                            : env_string("SLURM_JOB_NODELIST");
      ACCELERATE_CHECK(nodes.has_value(), "distributed environment: under srun but neither MASTER_ADDR "
                       "nor SLURM_STEP_NODELIST is set");
      env.master_addr = detail::first_slurm_host(*nodes);
    }
    if (auto port = env_int("MASTER_PORT")) {
      env.master_port = static_cast<int>(*port);
    } else {
      // One port per job, the same on every node, away from the ephemeral range.
      env.master_port = 20000 + static_cast<int>(env_int("SLURM_JOB_ID").value_or(0) % 10000);
    }
  } else {
    return env;
  }
  ACCELERATE_CHECK(env.world_size >= 1, "distributed environment (", env.source,
                   "): the world size must be at least 1, got ", env.world_size);
  ACCELERATE_CHECK(env.rank < env.world_size, "distributed environment (", env.source, "): rank ",
                   env.rank, " is not below the world size ", env.world_size);
  ACCELERATE_CHECK(env.local_world_size >= 1 && env.local_rank < env.local_world_size,
                   "distributed environment (", env.source, "): local rank ", env.local_rank,
                   " is not below the local world size ", env.local_world_size);
  ACCELERATE_CHECK(env.master_port > 0 && env.master_port < 65536, "distributed environment (",
                   env.source, "): MASTER_PORT ", env.master_port, " is not a TCP port");
  return env;
}

}  // namespace accelerate::distributed
