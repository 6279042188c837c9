// Zero-cost proofs: compiling this file is the test. Every "off" policy adds no member, no
// state and no scope object.
#include <accelerate/accelerate.hpp>

#include "../support/models.hpp"

namespace accelerate {
namespace {

using testing::TinyNet;

using Default = Accelerator<>;
static_assert(std::is_same_v<Default, Accelerator<SingleProcess, Fp32, NoAccumulation, NoClip>>);

// The default accelerator carries no per-policy state: the engine and the step states of
// accumulation, precision and clipping are empty and overlap.
static_assert(sizeof(Default) == sizeof(detail::CoreState));
static_assert(std::is_empty_v<distributed::LocalEngine>);
static_assert(std::is_empty_v<step::AccumulationStep<NoAccumulation>>);
static_assert(std::is_empty_v<step::AccumulationStep<Accumulate<1>>>);
static_assert(std::is_empty_v<step::PrecisionStep<Fp32>>);
static_assert(std::is_empty_v<step::PrecisionStep<Bf16>>);
static_assert(std::is_empty_v<step::ClipStep<NoClip>>);
static_assert(std::is_empty_v<step::ClipStep<ClipValue>>);

// Accumulate<1> is NoAccumulation; ClipValue has a run-time threshold but no state.
static_assert(!step::AccumulationStep<Accumulate<1>>::accumulating && step::AccumulationStep<Accumulate<2>>::accumulating &&
              step::AccumulationStep<AccumulateDynamic>::accumulating);
static_assert(sizeof(Accelerator<SingleProcess, Fp32, Accumulate<1>>) == sizeof(detail::CoreState));
static_assert(sizeof(Accelerator<SingleProcess, Fp32, NoAccumulation, ClipValue>) == sizeof(detail::CoreState));
static_assert(sizeof(Accelerator<SingleProcess, Bf16>) == sizeof(detail::CoreState));
// ...while the policies that need state have it.
static_assert(sizeof(Accelerator<SingleProcess, Fp32, Accumulate<4>>) > sizeof(detail::CoreState));
static_assert(sizeof(Accelerator<SingleProcess, Fp16>) > sizeof(detail::CoreState));

// Scopes that have nothing to do are empty types; sync_gradients is a compile-time true.
static_assert(std::is_empty_v<AutocastScope<Fp32>>);
static_assert(!std::is_empty_v<AutocastScope<Bf16>>);
static_assert(std::is_empty_v<AlwaysSyncScope> && AlwaysSyncScope::sync_gradients());
static_assert(std::is_same_v<decltype(std::declval<Default&>().accumulate(
                                 std::declval<PreparedModel<TinyNet, Default>&>())),
                             AlwaysSyncScope>);
static_assert(std::is_same_v<decltype(std::declval<Accelerator<SingleProcess, Fp32, Accumulate<1>>&>()
                                          .accumulate()),
                             AlwaysSyncScope>);
static_assert(std::is_empty_v<decltype(std::declval<Default&>().autocast())>);
static_assert(std::is_empty_v<NoSyncScope<distributed::NoModelSync, 0>>);
static_assert(Default::accumulating == false && Default::distributed == false);
static_assert(Default::context_type::plain_optimizer_step && Default::context_type::plain_scheduler_step);

// A single-process prepared model holds only the module (no reducer state, no accelerator
// pointer under Fp32); the optimizer and scheduler wrappers hold only the object (no context
// pointer, no precision slot).
static_assert(sizeof(PreparedModel<TinyNet, Default>) == sizeof(TinyNet));
static_assert(std::is_empty_v<Default::model_sync_type>);
static_assert(sizeof(PreparedOptimizer<torch::optim::SGD, Default>) ==
              sizeof(std::shared_ptr<torch::optim::SGD>));
static_assert(sizeof(PreparedScheduler<torch::optim::StepLR, Default>) ==
              sizeof(std::shared_ptr<torch::optim::StepLR>));
// NoClip adds no code path to the optimizer: it reaches the context only for real policies.
static_assert(!Accelerator<SingleProcess, Fp32, NoAccumulation, ClipNorm<>>::context_type::plain_optimizer_step);

// Without accumulation, accumulate() returns AlwaysSyncScope, whose sync_gradients() is a
// static constexpr true (asserted above), so `if (step.sync_gradients())` folds away.
static_assert(std::is_same_v<decltype(&Default::sync_gradients), bool (Default::*)() const noexcept>);

}  // namespace
}  // namespace accelerate
