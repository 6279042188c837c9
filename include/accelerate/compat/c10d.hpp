// c10d spellings that differ between LibTorch 2.x releases, and the construction of the
// stores and Gloo backend. The heavy c10d/Gloo includes live here and in distributed/ only.
#pragma once

#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

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
inline StorePtr make_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                               std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = is_server;
  options.numWorkers = world_size;
  options.waitWorkers = false;  // arrival is checked by the rendezvous, which names missing ranks
  options.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, options);
}

/// `store` with every key prefixed, so that groups do not see each other's keys.
inline StorePtr make_prefix_store(const std::string& prefix, StorePtr store) {
  return c10::make_intrusive<c10d::PrefixStore>(prefix, std::move(store));
}

/// A Gloo backend over `store`. `interface` names a network interface, else `hostname` is the
/// address to bind (this host's), else Gloo picks this host's name.
inline BackendPtr make_gloo_backend(StorePtr store, int rank, int world_size,
                                    std::chrono::milliseconds timeout, const std::string& hostname,
                                    const std::string& interface) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  if (!interface.empty()) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
  } else if (!hostname.empty()) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
}

}  // namespace accelerate::compat
