// PreparedModel: the user's module on the accelerator's device, called like the module, with
// the precision policy's forward side (its step state's ForwardScope and forward_output) and,
// when distributed, its gradient reducer.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include <accelerate/data/batch.hpp>
#include <accelerate/prepared/preparable.hpp>
#include <accelerate/step/precision.hpp>

namespace accelerate {

/// What prepare() returns for a module. `Holder` is the type the user passed (a TORCH_MODULE
/// holder or a std::shared_ptr<Impl>); `Acc` the accelerator.
///   - Fp32 with one process: holds only the module; operator() is a direct forward call.
///   - Bf16/Fp16: forward runs under autocast and floating outputs come back as fp32
///     (PrecisionOptions::convert_outputs_to_fp32), as the policy's step state says
///     (step::AutocastForward).
///   - Distributed: also holds the model's gradient reducer (see distributed/reducer.hpp);
///     before each forward rank 0's buffers are broadcast (DdpOptions::broadcast_buffers),
///     so every rank must call it, as with PyTorch DDP.
/// Example:
///   auto [model] = acc.prepare(Net());
///   auto out = model(x);          // Net's forward
///   model->train();               // the module's own API
///   Net& net = model.unwrap();    // the user's holder
template <class Holder, class Acc>
class PreparedModel {
  using Impl = typename detail::module_impl<Holder>::type;
  using PrecisionStep = step::PrecisionStep<typename Acc::precision_policy>;
  using ModelSync = typename Acc::engine_type::ModelSync;
  using Context = typename Acc::context_type;
  using ContextRef = detail::context_ref<const Context, PrecisionStep::wraps_forward>;

 public:
  PreparedModel(Holder module, const Context* context, ModelSync sync)
      : module_(std::move(module)), context_(context), sync_(std::move(sync)) {}

  /// Calls the module's forward under the precision policy's forward scope.
  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    if constexpr (!PrecisionStep::wraps_forward) {
      if constexpr (tracks_outputs) {
        sync_.before_forward();
        auto output = call_forward(std::forward<Args>(args)...);
        after_forward(output);
        return output;
      } else {
        return call_forward(std::forward<Args>(args)...);
      }
    } else {
      if constexpr (tracks_outputs) sync_.before_forward();
      auto output = [&] {
        typename PrecisionStep::ForwardScope scope(context_->device().type());
        return call_forward(std::forward<Args>(args)...);
      }();
      if constexpr (tracks_outputs) after_forward(output);
      return PrecisionStep::forward_output(std::move(output), context_->options().precision);
    }
  }

  /// The module itself, for its own API (`model->parameters()`, `model->eval()`).
  Impl* operator->() const noexcept { return detail::impl_pointer(module_); }
  Impl& operator*() const noexcept { return *detail::impl_pointer(module_); }
  Impl& impl() const noexcept { return *detail::impl_pointer(module_); }

  /// The user's module holder, as passed to prepare() (Accelerate's unwrap_model).
  Holder& unwrap() noexcept { return module_; }
  const Holder& unwrap() const noexcept { return module_; }

  /// The model's gradient synchronisation (empty with one process).
  ModelSync& model_sync() noexcept { return sync_; }

 private:
  // The module's forward, or the model sync's when it runs it (stage 3 gathers the sharded
  // parameters around it).
  template <class... Args>
  decltype(auto) call_forward(Args&&... args) {
    if constexpr (requires { sync_.forward(impl(), std::forward<Args>(args)...); })
      return sync_.forward(impl(), std::forward<Args>(args)...);
    else
      return impl().forward(std::forward<Args>(args)...);
  }

  // A distributed model's sync runs before each forward (buffers) and may need the forward's
  // outputs (to find unused parameters early).
  static constexpr bool tracks_outputs = requires(ModelSync& s, const std::vector<at::Tensor>& outputs) {
    s.before_forward();
    s.expect_gradients_from(outputs);
  };

  template <class Output>
  void after_forward(const Output& output) {
    if constexpr (data::is_nested_v<Output>) {
      if (!sync_.wants_forward_outputs()) return;
      std::vector<at::Tensor> tensors;
      data::for_each_tensor(output, [&](const at::Tensor& t) { tensors.push_back(t); });
      sync_.expect_gradients_from(tensors);
    }
  }

  Holder module_;
  [[no_unique_address]] ContextRef context_;
  [[no_unique_address]] ModelSync sync_;
};

}  // namespace accelerate
