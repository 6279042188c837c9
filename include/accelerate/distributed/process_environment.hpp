// ProcessEnvironment: who this process is (rank, world, node) and where to rendezvous, read
// from torchrun's variables (also what accelerate::launch sets), Open MPI's or SLURM's.
#pragma once

#include <cctype>
#include <cstdint>
#include <optional>
#include <string>

#include <accelerate/detail/check.hpp>
#include <accelerate/detail/env.hpp>
#include <accelerate/detail/linkage.hpp>

namespace accelerate::distributed {

/// This process's place in the job and the rendezvous address.
struct ProcessEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// Where it came from: "none", "torchrun" (also accelerate::launch), "openmpi" or "slurm".
  std::string source = "none";

  bool launched() const noexcept { return source != "none"; }
};

}  // namespace accelerate::distributed

namespace accelerate::detail {

int require_int(const char* name, const char* launcher);

/// "node[01-04],gpu7" -> "node01": the first host of a SLURM node list.
std::string first_slurm_host(const std::string& list);

/// "4" or "4(x2),2" -> 4: this node's task count from SLURM_STEP_TASKS_PER_NODE (first node's
/// count; SLURM gives every node of a homogeneous step the same).
int first_slurm_count(const std::string& spec);

}  // namespace accelerate::detail

namespace accelerate::distributed {

/// Reads the environment. No launcher variables means one process ("none"). Variables that
/// are partly set, or inconsistent (RANK >= WORLD_SIZE...), are errors naming the variable.
ProcessEnvironment detect_environment();

}  // namespace accelerate::distributed

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/distributed/process_environment.ipp>
#endif
