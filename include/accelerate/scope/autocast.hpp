// AutocastScope<Precision>: RAII autocast for a precision policy; an empty type under Fp32.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <accelerate/compat/torch.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/policy/precision.hpp>

namespace accelerate {

/// Autocast to `P::dtype` on one device type for the scope's lifetime, restoring the previous
/// autocast state on exit (scopes nest). Returned by Accelerator::autocast() and used around the
/// prepared model's forward.
/// Example:
///   { auto scope = acc.autocast();  auto loss = complex_loss(out, y); }
template <PrecisionPolicy P, bool Enabled = P::autocast>
class [[nodiscard, maybe_unused]] AutocastScope {
 public:
  explicit AutocastScope(c10::DeviceType device_type)
      : device_type_(device_type),
        previous_enabled_(compat::autocast_enabled(device_type)),
        previous_dtype_(compat::autocast_dtype(device_type)) {
    // The dtype first: if the device rejects it, autocast must not be left enabled.
    compat::set_autocast_dtype(device_type, P::dtype);
    compat::set_autocast_enabled(device_type, true);
    compat::autocast_increment_nesting();
  }
  ~AutocastScope() {
    // The weight cast cache lives until the outermost scope closes, as in torch.autocast.
    if (compat::autocast_decrement_nesting() == 0) compat::autocast_clear_cache();
    compat::set_autocast_enabled(device_type_, previous_enabled_);
    compat::set_autocast_dtype(device_type_, previous_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType device_type_;
  bool previous_enabled_;
  c10::ScalarType previous_dtype_;
};

/// Under a policy without autocast (Fp32) the scope is empty and does nothing.
template <PrecisionPolicy P>
class [[nodiscard, maybe_unused]] AutocastScope<P, false> {
 public:
  explicit constexpr AutocastScope(c10::DeviceType) noexcept {}
  // User-provided (and empty), so that an unused scope variable draws no warning.
  ~AutocastScope() {}
};

}  // namespace accelerate
