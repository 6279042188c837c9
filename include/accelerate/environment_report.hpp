// environment_report(): versions, build settings, hardware, the distributed environment and
// (for an Accelerator type) its policies, as `accelerate env` prints for bug reports.
#pragma once

#include <sys/utsname.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <ATen/Version.h>
#include <torch/cuda.h>

#include <accelerate/compat/torch.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/detail/type_name.hpp>
#include <accelerate/distributed/process_environment.hpp>
#include <accelerate/policy/slots.hpp>
#include <accelerate/version.hpp>

extern char** environ;

namespace accelerate {

namespace detail {
// Asking LibTorch fixes its choice for the process, so it is asked only once the variable it
// reads is set: a report printed before the Accelerator is built must not turn huge pages off.
std::string cpu_huge_pages_line();
}  // namespace detail

/// The environment, one "- key: value" line each, then LibTorch's own build configuration.
/// Example:
///   std::cout << accelerate::environment_report<Acc>();   // fashion_mnist --env
std::string environment_report();

/// The report plus the policies of Accelerator type `Acc`.
template <class Acc>
std::string environment_report() {
  std::ostringstream out;
  out << "- Policies: " << detail::describe_slots(typename Acc::policies{}) << " (distributed_type "
      << Acc::distributed_type() << ", mixed_precision " << Acc::mixed_precision() << ")\n";
  return out.str() + environment_report();
}

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/environment_report.ipp>
#endif
