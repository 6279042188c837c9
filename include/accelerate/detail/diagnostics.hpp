// Compile-time diagnostics: incomplete "rejected" types that make the compiler print the culprit.
#pragma once

namespace accelerate::detail {

/// Slot tags, so that a rejected policy's diagnostic names the slot it was given for.
struct BackendSlot;
struct PrecisionSlot;
struct AccumulationSlot;
struct ClipSlot;
/// The engine named by `backend_engine<B>` for a Backend policy B.
struct BackendEngineSlot;
/// A policy's step state (step::PrecisionStep<P>, AccumulationStep<A>, ClipStep<C>).
struct PrecisionStepSlot;
struct AccumulationStepSlot;
struct ClipStepSlot;

/// Never defined: naming it prints `Slot` and the offending type `T` in the compiler's output
/// (the trick {fmt} uses with `type_is_unformattable_for`).
template <class Slot, class T>
struct rejected_policy;

/// False, but only once T is known: a static_assert in a discarded `if constexpr` branch.
template <class T>
inline constexpr bool dependent_false = false;

/// Never defined: a type given to prepare() that is not a model, optimizer, scheduler or data.
template <class T>
struct unpreparable_type;

/// `accepted<Slot, T, ok>` is true; when `ok` is false it first names `rejected_policy<Slot, T>`,
/// an incomplete type, so the error message carries T.
template <class Slot, class T, bool Ok>
inline constexpr bool accepted = true;
template <class Slot, class T>
inline constexpr bool accepted<Slot, T, false> = sizeof(rejected_policy<Slot, T>) == 0;

}  // namespace accelerate::detail
