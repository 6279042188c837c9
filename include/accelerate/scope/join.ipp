// Bodies of join.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <accelerate/scope/join.hpp>

namespace accelerate {

ACCELERATE_INLINE void JoinScope::join() {
  if (!join_) return;
  auto run = std::exchange(join_, {});
  run();
}

ACCELERATE_INLINE JoinScope::~JoinScope() noexcept(false) {
  auto detach = std::exchange(detach_, {});
  if (join_ && std::uncaught_exceptions() == exceptions_) {
    try {
      join();
    } catch (...) {
      if (detach) detach();
      throw;
    }
  }
  if (detach) detach();
}

}  // namespace accelerate
