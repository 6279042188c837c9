// c10d spellings that differ between LibTorch 2.x releases, and the construction of the
// stores and Gloo backend. The heavy c10d/Gloo includes live here and in distributed/ only;
// the Gloo and store implementations' headers only in c10d.ipp, which constructs them (a
// trainer compiled with ACCELERATE_SEPARATE_COMPILATION does not parse them).
#pragma once

#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#include <accelerate/detail/linkage.hpp>

#ifndef USE_C10D_GLOO
#error "accelerate: this LibTorch was built without Gloo (USE_C10D_GLOO is not defined)"
#endif

namespace accelerate::compat {

/// A c10d backend (ProcessGroupGloo, ProcessGroupNCCL): in 2.x these derive from c10d::Backend.
using BackendPtr = c10::intrusive_ptr<c10d::Backend>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;

/// A TCPStore: rank 0 serves, the others connect, each within `timeout`. Fields are set by
/// name because their order changed across 2.x releases.
StorePtr make_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                        std::chrono::milliseconds timeout);

/// `store` with every key prefixed, so that groups do not see each other's keys.
StorePtr make_prefix_store(const std::string& prefix, StorePtr store);

/// A Gloo backend over `store`. `interface` names a network interface, else `hostname` is the
/// address to bind (this host's), else Gloo picks this host's name.
BackendPtr make_gloo_backend(StorePtr store, int rank, int world_size,
                             std::chrono::milliseconds timeout, const std::string& hostname,
                             const std::string& interface);

}  // namespace accelerate::compat

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/compat/c10d.ipp>
#endif
