// Bodies of c10d.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <accelerate/compat/c10d.hpp>

namespace accelerate::compat {

ACCELERATE_INLINE StorePtr make_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                                          std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = is_server;
  options.numWorkers = world_size;
  options.waitWorkers = false;  // arrival is checked by the rendezvous, which names missing ranks
  options.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, options);
}

ACCELERATE_INLINE StorePtr make_prefix_store(const std::string& prefix, StorePtr store) {
  return c10::make_intrusive<c10d::PrefixStore>(prefix, std::move(store));
}

ACCELERATE_INLINE BackendPtr make_gloo_backend(StorePtr store, int rank, int world_size,
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
