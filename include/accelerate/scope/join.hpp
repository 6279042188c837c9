// JoinScope: what Accelerator::join_uneven_inputs returns (training on shards of different
// lengths without a hang).
#pragma once

#include <exception>
#include <functional>
#include <utility>

#include <accelerate/detail/linkage.hpp>

namespace accelerate {

/// While it lives, the prepared models it was made for announce each forward to ranks that
/// ran out of batches, which shadow the others' collectives from join() on. Leaving the scope
/// joins (unless an exception is leaving it: then the ranks are not in step anyway, and the
/// process group's timeout ends the others). Empty with one process.
/// Example:
///   {
///     auto join = acc.join_uneven_inputs(model);
///     for (auto& [x, y] : loader) { ... }
///   }  // this rank waits here, shadowing, until every rank's loop is over
class JoinScope {
 public:
  JoinScope() = default;
  /// `join` runs this rank's side until every rank has run out; `detach` ends the scope.
  JoinScope(std::function<void()> join, std::function<void()> detach)
      : join_(std::move(join)), detach_(std::move(detach)), exceptions_(std::uncaught_exceptions()) {}
  JoinScope(JoinScope&& other) noexcept
      : join_(std::exchange(other.join_, {})), detach_(std::exchange(other.detach_, {})),
        exceptions_(other.exceptions_) {}
  JoinScope& operator=(JoinScope&&) = delete;
  JoinScope(const JoinScope&) = delete;
  JoinScope& operator=(const JoinScope&) = delete;

  /// This rank has no more batches: match the collectives of the ranks still training until
  /// none is, then take the model from the last one to finish. Once; the destructor calls it
  /// otherwise. An error (a peer gone) is thrown here.
  void join();

  ~JoinScope() noexcept(false);

 private:
  std::function<void()> join_;
  std::function<void()> detach_;
  int exceptions_ = 0;
};

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/scope/join.ipp>
#endif
