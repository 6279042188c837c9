// Bodies of environment_report.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/environment_report.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE std::string cpu_huge_pages_line() {
  std::string kernel = "unknown";
  std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  if (std::getline(mode, modes)) {
    const auto open = modes.find('['), close = modes.find(']');
    if (open != std::string::npos && close > open) kernel = modes.substr(open + 1, close - open - 1);
  }
  const char* variable = std::getenv("THP_MEM_ALLOC_ENABLE");
  std::string answer = "no (THP_MEM_ALLOC_ENABLE unset; an Accelerator sets it)";
  if (variable != nullptr) {
    const auto on = compat::cpu_huge_pages();
    answer = !on ? "unknown in this LibTorch"
             : *on ? "yes"
                   : std::string("no (THP_MEM_ALLOC_ENABLE=") + variable +
                         (std::atoi(variable) == 0 ? ")" : ", read before it was set: a CPU tensor came first)");
  }
  return answer + ", kernel THP mode " + kernel;
}

}  // namespace accelerate::detail

namespace accelerate {

ACCELERATE_INLINE std::string environment_report() {
  std::ostringstream out;
  out << "- accelerate-cpp version: " << version_string << '\n';
  out << "- LibTorch version: " << compat::torch_version << '\n';
#ifdef USE_C10D_GLOO
  out << "- Gloo backend: compiled in\n";
#else
  out << "- Gloo backend: not in this LibTorch\n";
#endif
#ifdef USE_C10D_NCCL
  out << "- NCCL backend: compiled in (ProcessGroupNCCL)\n";
#else
  out << "- NCCL backend: not in this LibTorch\n";
#endif
  out << "- CUDA available: " << (torch::cuda::is_available() ? "yes" : "no") << ", devices: "
      << torch::cuda::device_count() << '\n';
  out << "- Compiler: " <<
#if defined(__clang__)
      "clang "
#elif defined(__GNUC__)
      "g++ "
#endif
      << __VERSION__ << ", C++ " << __cplusplus << ", _GLIBCXX_USE_CXX11_ABI=" << _GLIBCXX_USE_CXX11_ABI << '\n';
  struct utsname uts {};
  if (::uname(&uts) == 0) out << "- Platform: " << uts.sysname << ' ' << uts.release << ' ' << uts.machine << '\n';
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  out << "- CPUs: " << std::thread::hardware_concurrency() << ", RAM: "
      << (pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) / (1 << 30) : 0.0) << " GiB\n";
  out << "- CPU tensors on huge pages: " << detail::cpu_huge_pages_line() << '\n';
  try {
    const auto env = distributed::detect_environment();
    out << "- Distributed environment: " << env.source;
    if (env.launched())
      out << ", rank " << env.rank << " of " << env.world_size << ", local rank " << env.local_rank << " of "
          << env.local_world_size << ", rendezvous " << env.master_addr << ':' << env.master_port;
    out << '\n';
  } catch (const std::exception& e) {
    out << "- Distributed environment: invalid (" << e.what() << ")\n";
  }
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (entry.rfind("ACCELERATE_", 0) == 0 || entry.rfind("OMP_NUM_THREADS=", 0) == 0 ||
        entry.rfind("GLOO_SOCKET_IFNAME=", 0) == 0 || entry.rfind("CUDA_VISIBLE_DEVICES=", 0) == 0 ||
        entry.rfind("THP_MEM_ALLOC_ENABLE=", 0) == 0)
      out << "- " << entry << '\n';
  }
  out << "- LibTorch build configuration:\n";
  std::istringstream config(at::show_config());
  for (std::string line; std::getline(config, line);)
    if (!line.empty()) out << "    " << line << '\n';
  return out.str();
}

}  // namespace accelerate
