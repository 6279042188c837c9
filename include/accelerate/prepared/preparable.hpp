// What prepare() accepts, one concept per kind, and how each argument is held.
//
// Customization points: a model is anything ModuleLike; an optimizer derives from
// torch::optim::Optimizer; a scheduler from torch::optim::LRScheduler or ReduceLROnPlateauScheduler; data is an
// accelerate::DataLoader, a map-style dataset (MapDataset) or a range of batches (BatchRange).
#pragma once

#include <concepts>
#include <cstddef>
#include <iterator>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include <c10/util/ArrayRef.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/optim/schedulers/reduce_on_plateau_scheduler.h>

#include <accelerate/data/loader.hpp>

namespace accelerate {

namespace detail {

template <class T>
struct module_impl {
  using type = void;
};
template <class Impl>
  requires std::derived_from<Impl, torch::nn::Module>
struct module_impl<std::shared_ptr<Impl>> {
  using type = Impl;
};
template <class T>
  requires requires { typename T::ContainedType; } &&
           std::derived_from<T, torch::nn::ModuleHolder<typename T::ContainedType>>
struct module_impl<T> {
  using type = typename T::ContainedType;
};

/// The shared module behind a holder or shared_ptr.
template <class Holder>
std::shared_ptr<torch::nn::Module> module_pointer(const Holder& holder) {
  if constexpr (requires { holder.ptr(); }) return holder.ptr();
  else return holder;
}

/// The module object behind a holder or shared_ptr.
template <class Holder>
auto* impl_pointer(const Holder& holder) noexcept {
  if constexpr (requires { holder.ptr(); }) return holder.ptr().get();
  else return holder.get();
}

template <class T>
struct pointee {
  using type = T;
};
template <class T>
struct pointee<std::shared_ptr<T>> {
  using type = T;
};
template <class T, class D>
struct pointee<std::unique_ptr<T, D>> {
  using type = T;
};

template <class T>
using pointee_t = typename pointee<std::remove_cvref_t<T>>::type;

/// Takes ownership of rvalues and smart pointers; refers to lvalues (the caller keeps them
/// alive, as a LibTorch scheduler holds its optimizer by reference).
template <class T>
std::shared_ptr<pointee_t<T>> hold(T&& object) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, std::shared_ptr<pointee_t<T>>>) {
    return object;
  } else if constexpr (!std::is_same_v<U, pointee_t<T>>) {  // unique_ptr
    return std::shared_ptr<pointee_t<T>>(std::move(object));
  } else if constexpr (std::is_lvalue_reference_v<T>) {
    return std::shared_ptr<U>(std::shared_ptr<void>{}, &object);  // non-owning, no allocation
  } else {
    return std::make_shared<U>(std::move(object));
  }
}

/// What a prepared wrapper keeps of its accelerator's shared state (a step::Context): a
/// pointer when one of the policies needs it, else this empty stand-in (stored
/// [[no_unique_address]], so it costs nothing).
struct NoContext {
  template <class Context>
  constexpr NoContext(Context*) noexcept {}
};
template <class Context, bool Needed>
using context_ref = std::conditional_t<Needed, Context*, NoContext>;

template <class T>
struct is_data_loader : std::false_type {};
template <class D>
struct is_data_loader<DataLoader<D>> : std::true_type {};

}  // namespace detail

/// A torch::nn module holder (`Net` from TORCH_MODULE) or a std::shared_ptr to a Module.
template <class T>
concept ModuleLike = !std::is_void_v<typename detail::module_impl<std::remove_cvref_t<T>>::type>;

/// A torch::optim optimizer, by reference, by value, or behind a smart pointer.
template <class T>
concept OptimizerLike = std::derived_from<detail::pointee_t<T>, torch::optim::Optimizer>;

/// A torch::optim learning-rate scheduler (an LRScheduler, a user's subclass of it, or a
/// ReduceLROnPlateauScheduler), by reference, by value, or behind a smart pointer.
template <class T>
concept SchedulerLike = std::derived_from<detail::pointee_t<T>, torch::optim::LRScheduler> ||
                        std::derived_from<detail::pointee_t<T>, torch::optim::ReduceLROnPlateauScheduler>;

/// A map-style dataset: a size and either get(index) or a whole-batch get_batch(indices).
template <class D>
concept MapDataset = requires(D& dataset) {
  { dataset.size() };
} && (requires(D& dataset, std::size_t i) { dataset.get(i); } ||
      requires(D& dataset, c10::ArrayRef<int64_t> indices) { dataset.get_batch(indices); });

/// Something iterable whose elements are batches (a vector of batches, a LibTorch DataLoader
/// behind its unique_ptr, a range-v3 view...).
template <class R>
concept BatchRange = requires(detail::pointee_t<R>& range) {
  range.begin();
  range.end();
  *range.begin();
  range.begin() != range.end();
};

/// An accelerate::DataLoader description.
template <class T>
concept DataLoaderSpec = detail::is_data_loader<std::remove_cvref_t<T>>::value;

/// Anything prepare() turns into a prepared dataloader.
template <class T>
concept DataSource = DataLoaderSpec<T> || MapDataset<std::remove_cvref_t<T>> ||
                     (BatchRange<T> && !ModuleLike<T>);

}  // namespace accelerate
