// Accelerate's collectives as free functions over any BackendEngine: gather, gather_for_metrics,
// reduce, broadcast, pad_across_processes, split_between_processes and the object collectives.
// They work on tensors and nested containers (vectors, arrays, tuples, maps, Examples) whose
// leaves are all tensors; a number or string leaf is a compile-time error (it could only come
// back as this rank's own value). Other values travel as JSON through gather_object and
// broadcast_object. The Accelerator's members of the same names forward here; an engine of
// one process (E::distributed false) returns the input at compile time.
//
// Every tensor collective first all-gathers each rank's layout (layout_check.hpp), so ranks
// that pass different tensors fail together with an accelerate::Error naming both.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <accelerate/data/batch.hpp>
#include <accelerate/data/batch_layout.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/distributed/engine.hpp>
#include <accelerate/distributed/layout_check.hpp>
#include <accelerate/distributed/reduction.hpp>
#include <accelerate/gradient_state.hpp>
#include <accelerate/options.hpp>

// Helpers first: the templates below name them qualified, which binds at definition.
namespace accelerate::detail {

/// Every rank's layout of the tensor it passes to collective `kind`, after checking that they
/// agree (all but `free_dim`): a mismatch is an error on every rank, before any payload moves.
template <class E>
std::vector<distributed::TensorLayout> agree_on_layout(E& engine, distributed::CollectiveKind kind,
                                                       std::int64_t argument, const at::Tensor& t,
                                                       std::int64_t free_dim = -1) {
  const at::Tensor mine = distributed::encode_layout(kind, argument, t).to(engine.collective_device());
  std::vector<distributed::TensorLayout> layouts;
  for (const auto& part : engine.all_gather(mine)) layouts.push_back(distributed::decode_layout(part));
  distributed::check_layouts(layouts, free_dim);
  return layouts;
}

/// Every rank's tensor (rows may differ), in rank order.
template <class E>
std::vector<at::Tensor> gather_parts(E& engine, const at::Tensor& t) {
  const at::Tensor local = t.dim() == 0 ? t.reshape({1}) : t.contiguous();
  std::int64_t max_rows = 0;
  std::vector<std::int64_t> counts;
  for (const auto& layout : agree_on_layout(engine, distributed::CollectiveKind::gather, 0, local, 0)) {
    counts.push_back(layout.shape[0]);
    max_rows = std::max(max_rows, counts.back());
  }
  at::Tensor padded = local;
  if (local.size(0) < max_rows) {  // all_gather takes equal sizes: pad, then cut back
    std::vector<std::int64_t> shape(local.sizes().begin(), local.sizes().end());
    shape[0] = max_rows;
    padded = at::zeros(shape, local.options());
    padded.narrow(0, 0, local.size(0)).copy_(local);
  }
  std::vector<at::Tensor> parts = engine.all_gather(padded);
  for (std::size_t r = 0; r < parts.size(); ++r) parts[r] = parts[r].narrow(0, 0, counts[r]);
  return parts;
}

template <class E>
at::Tensor broadcast_tensor(E& engine, const at::Tensor& t, int from) {
  // Every rank's layout travels first: receivers learn the sender's shape and dtype, and all
  // ranks agree on the root before any payload moves.
  ACCELERATE_CHECK(from >= 0 && from < engine.world_size(), "broadcast: from = ", from,
                   " is not a rank of this job (", engine.world_size(), " processes)");
  const bool sender = engine.rank() == from;
  const auto layouts = agree_on_layout(engine, distributed::CollectiveKind::broadcast, from, t);
  const auto& sent = layouts[static_cast<std::size_t>(from)];
  at::Tensor out = sender ? t.contiguous().clone()
                          : at::empty(sent.shape, at::TensorOptions().dtype(sent.dtype).device(engine.collective_device()));
  engine.broadcast(out, from);
  return out;
}

/// A value as CBOR bytes in a uint8 tensor on the engine's collective device (NCCL takes no
/// CPU tensors).
template <class T>
at::Tensor object_bytes(const T& value, c10::Device device) {
  const std::vector<std::uint8_t> bytes = nlohmann::json::to_cbor(nlohmann::json(value));
  return at::tensor(at::ArrayRef<std::uint8_t>(bytes), at::kByte).to(device);
}

template <class T>
T object_from_bytes(const at::Tensor& tensor) {
  const at::Tensor cpu = tensor.to(at::kCPU).contiguous();
  const auto* begin = cpu.data_ptr<std::uint8_t>();
  try {
    return nlohmann::json::from_cbor(begin, begin + cpu.numel()).template get<T>();
  } catch (const nlohmann::json::exception& e) {
    fail("object collective: a rank's value does not read back as the type expected here (", e.what(),
         "); every rank must pass the same type");
  }
}

}  // namespace accelerate::detail

namespace accelerate::distributed {

/// Concatenates every process's tensors along dimension 0, in rank order. Sizes along
/// dimension 0 may differ between processes.
/// Example:
///   at::Tensor all = accelerate::distributed::gather(engine, predictions);
template <BackendEngine E, class T>
T gather([[maybe_unused]] E& engine, const T& data) {
  static_assert(data::tensors_only_v<T>,
                "accelerate::gather: every leaf must be a tensor; gather numbers, strings or structs "
                "with gather_object(value)");
  if constexpr (!E::distributed) {
    return data;
  } else {
    return data::map_tensors(data, [&](const at::Tensor& t) { return at::cat(accelerate::detail::gather_parts(engine, t)); });
  }
}

/// Every process's `value`, in rank order, for any value nlohmann::json can serialise
/// (numbers, strings, vectors, maps, your types with to_json/from_json).
/// Example:
///   std::vector<std::string> names = accelerate::distributed::gather_object(engine, name);
template <BackendEngine E, class T>
  requires(!data::tensors_only_v<T>)
std::vector<T> gather_object([[maybe_unused]] E& engine, const T& value) {
  if constexpr (!E::distributed) {
    return {value};
  } else {
    std::vector<T> out;
    for (const at::Tensor& part : accelerate::detail::gather_parts(engine, accelerate::detail::object_bytes(value, engine.collective_device())))
      out.push_back(accelerate::detail::object_from_bytes<T>(part));
    return out;
  }
}

/// Process `from`'s `value` on every process, for any value nlohmann::json can serialise.
/// Example:
///   auto vocabulary = accelerate::distributed::broadcast_object(engine, local_vocabulary, 0);
template <BackendEngine E, class T>
  requires(!data::tensors_only_v<T>)
T broadcast_object([[maybe_unused]] E& engine, const T& value, [[maybe_unused]] int from = 0) {
  if constexpr (!E::distributed) {
    return value;
  } else {
    return accelerate::detail::object_from_bytes<T>(
        accelerate::detail::broadcast_tensor(engine, accelerate::detail::object_bytes(value, engine.collective_device()), from));
  }
}

/// gather(), and on the last batch of a prepared dataloader being iterated (`state`) drop the
/// samples that even batching duplicated, so a whole evaluation gathers exactly the dataset's
/// length. Outside a prepared loop nothing is dropped. A value not made of tensors (or
/// `use_gather_object`) goes through gather_object: a vector's elements are concatenated in
/// rank order and the duplicates dropped as for tensors; any other value comes back as the
/// vector of every rank's value.
/// Example:
///   auto predictions = accelerate::distributed::gather_for_metrics(engine, state, logits.argmax(1));
template <BackendEngine E, class T>
auto gather_for_metrics(E& engine, const GradientState& state, const T& data,
                        const GatherForMetricsOptions& options = {}) {
  const bool truncate = state.end_of_dataloader() && state.remainder() > 0;
  const auto keep = state.remainder();
  if constexpr (data::tensors_only_v<T>) {
    ACCELERATE_CHECK(!options.use_gather_object, "gather_for_metrics: use_gather_object needs a value "
                     "JSON can serialise; these are tensors (leave it false)");
    T gathered = gather(engine, data);
    if (!truncate) return gathered;
    return data::map_tensors(gathered, [&](const at::Tensor& t) {
      return t.dim() > 0 && t.size(0) > keep ? t.narrow(0, 0, keep) : t;
    });
  } else if constexpr (detail::is_vector<T>::value) {
    T gathered;
    for (auto& part : gather_object(engine, data)) gathered.insert(gathered.end(), part.begin(), part.end());
    if (truncate && gathered.size() > static_cast<std::size_t>(keep)) gathered.resize(static_cast<std::size_t>(keep));
    return gathered;
  } else {
    return gather_object(engine, data);
  }
}

/// Combines every process's tensors element-wise (sum, mean, max, min).
/// Example:
///   at::Tensor total = accelerate::distributed::reduce(engine, correct, accelerate::Reduction::sum);
template <BackendEngine E, class T>
T reduce([[maybe_unused]] E& engine, const T& data, [[maybe_unused]] Reduction reduction = Reduction::sum) {
  static_assert(data::tensors_only_v<T>,
                "accelerate::reduce: every leaf must be a tensor; a number or string would come back "
                "unreduced (wrap numbers in a tensor)");
  if constexpr (!E::distributed) {
    return data;
  } else {
    return data::map_tensors(data, [&](const at::Tensor& t) {
      accelerate::detail::agree_on_layout(engine, CollectiveKind::reduce, static_cast<std::int64_t>(reduction), t);
      at::Tensor out = t.clone();
      engine.all_reduce(out, reduction);
      return out;
    });
  }
}

/// Every process receives process `from`'s tensors (shapes and dtypes follow the sender).
/// Example:
///   at::Tensor weights = accelerate::distributed::broadcast(engine, local_weights, 0);
template <BackendEngine E, class T>
T broadcast([[maybe_unused]] E& engine, const T& data, [[maybe_unused]] int from = 0) {
  static_assert(data::tensors_only_v<T>,
                "accelerate::broadcast: every leaf must be a tensor; broadcast numbers, strings or "
                "structs with broadcast_object(value)");
  if constexpr (!E::distributed) {
    return data;
  } else {
    return data::map_tensors(data, [&](const at::Tensor& t) { return accelerate::detail::broadcast_tensor(engine, t, from); });
  }
}

/// Process `from`'s nested `value` (tensors of any dtype and shape in vectors, maps, tuples,
/// Examples, with number and string leaves), packed by data::pack_batch, on every process in
/// two messages: the sizes, then the JSON layout and every tensor's bytes. Returns the layout
/// and the bytes (on the engine's collective device), from which data::unpack_batch rebuilds
/// the value or any part of it; nothing, on every process, when the sender passes no value
/// (`value` is read on the sender only).
/// Example:
///   auto packed = accelerate::distributed::broadcast_packed(engine, rank == 0 ? &batch : nullptr, 0);
///   if (packed) batch = accelerate::data::unpack_batch<Batch>(packed->first, packed->second);
template <BackendEngine E, class T>
std::optional<std::pair<nlohmann::json, at::Tensor>> broadcast_packed(E& engine, const T* value, int from = 0) {
  const c10::Device device = engine.collective_device();
  const bool sender = engine.rank() == from;
  std::string text;
  at::Tensor bytes;
  at::Tensor sizes = at::zeros({3}, at::kLong);  // a value follows, the layout's length, the bytes
  if (sender && value != nullptr) {
    auto [layout, packed] = data::pack_batch(*value, device);
    text = layout.dump();
    bytes = std::move(packed);
    sizes = at::tensor({std::int64_t{1}, static_cast<std::int64_t>(text.size()), bytes.numel()}, at::kLong);
  }
  if constexpr (E::distributed) {
    sizes = sizes.to(device);
    engine.broadcast(sizes, from);
    sizes = sizes.cpu();
  }
  if (sizes[0].item<std::int64_t>() == 0) return std::nullopt;
  const std::int64_t text_size = sizes[1].item<std::int64_t>(), byte_size = sizes[2].item<std::int64_t>();
  at::Tensor message;
  if (sender) {
    message = at::cat({at::from_blob(text.data(), {text_size}, at::kByte).to(device), bytes});
  } else {
    message = at::empty({text_size + byte_size}, at::TensorOptions().dtype(at::kByte).device(device));
  }
  if constexpr (E::distributed) engine.broadcast(message, from);
  const at::Tensor layout_bytes = message.narrow(0, 0, text_size).cpu().contiguous();
  const auto* begin = reinterpret_cast<const char*>(layout_bytes.data_ptr<std::uint8_t>());
  return std::pair{nlohmann::json::parse(begin, begin + text_size), message.narrow(0, text_size, byte_size)};
}

/// Pads each tensor along `dim` with `pad_value` to the largest size across processes
/// (before the data when `pad_first`), so they can be gathered.
/// Example:
///   auto padded = accelerate::distributed::pad_across_processes(engine, tokens, 1, pad_id);
template <BackendEngine E, class T>
T pad_across_processes([[maybe_unused]] E& engine, const T& data, [[maybe_unused]] std::int64_t dim = 0,
                       [[maybe_unused]] double pad_value = 0, [[maybe_unused]] bool pad_first = false) {
  static_assert(data::tensors_only_v<T>, "accelerate::pad_across_processes: every leaf must be a tensor");
  if constexpr (!E::distributed) {
    return data;
  } else {
    return data::map_tensors(data, [&](const at::Tensor& t) {
      // Layouts first, so that a rank whose tensor has another rank fails with its peers
      // instead of leaving them waiting.
      const std::int64_t d = dim < 0 ? dim + t.dim() : dim;
      const auto layouts = accelerate::detail::agree_on_layout(engine, CollectiveKind::pad, dim, t, d);
      ACCELERATE_CHECK(d >= 0 && d < t.dim(), "pad_across_processes: dim ", dim,
                       " is out of range for a tensor of shape ", t.sizes());
      std::int64_t target = 0;
      for (const auto& layout : layouts) target = std::max(target, layout.shape[static_cast<std::size_t>(d)]);
      if (target == t.size(d)) return t;
      std::vector<std::int64_t> shape(t.sizes().begin(), t.sizes().end());
      shape[static_cast<std::size_t>(d)] = target;
      at::Tensor out = at::full(shape, pad_value, t.options());
      const std::int64_t offset = pad_first ? target - t.size(d) : 0;
      out.narrow(d, offset, t.size(d)).copy_(t);
      return out;
    });
  }
}

/// Process `rank`'s contiguous share of `inputs` (a vector or a tensor's rows) among `world`
/// processes: the first len % world get one extra item; with `apply_padding` every process
/// gets ceil(len / world) items, the last item repeated. A std::map of name -> vector or
/// tensor (Accelerate's dict) is split value by value at the same positions; its values must
/// all have the same length (else an error naming the first that differs). Communicates
/// nothing.
/// Example:
///   auto mine = accelerate::distributed::split_between_processes(prompts, rank, world);
///   auto part = split_between_processes(std::map<std::string, at::Tensor>{{"x", x}, {"y", y}}, rank, world);
template <class T>
T split_between_processes(const T& inputs, int rank, int world, bool apply_padding = false) {
  const auto processes = static_cast<std::size_t>(world);
  const auto index = static_cast<std::size_t>(rank);
  auto slice_range = [&](std::size_t length) {
    const std::size_t base = length / processes, extra = length % processes;
    const std::size_t begin = index * base + std::min(index, extra);
    const std::size_t count = base + (index < extra ? 1 : 0);
    return std::pair{begin, count};
  };
  if constexpr (accelerate::detail::is_string_map<T>::value) {
    (void)slice_range;
    T out;
    if (inputs.empty()) return out;
    const auto length_of = [](const auto& value) -> std::size_t {
      if constexpr (std::is_same_v<std::decay_t<decltype(value)>, at::Tensor>)
        return value.dim() == 0 ? 0 : static_cast<std::size_t>(value.size(0));
      else return value.size();
    };
    const auto& first = *inputs.begin();
    const std::size_t length = length_of(first.second);
    for (const auto& [key, value] : inputs) {
      ACCELERATE_CHECK(length_of(value) == length, "split_between_processes: every value of the map must have "
                       "the same length, but '", first.first, "' has ", length, " and '", key, "' ", length_of(value));
      out.emplace(key, split_between_processes(value, rank, world, apply_padding));
    }
    return out;
  } else if constexpr (std::is_same_v<T, at::Tensor>) {
    const auto length = static_cast<std::size_t>(inputs.size(0));
    auto [begin, count] = slice_range(length);
    at::Tensor out = inputs.narrow(0, static_cast<std::int64_t>(begin), static_cast<std::int64_t>(count));
    const std::size_t target = (length + processes - 1) / processes;
    if (apply_padding && count < target && length > 0) {
      std::vector<std::int64_t> repeats(static_cast<std::size_t>(inputs.dim()), 1);
      repeats[0] = static_cast<std::int64_t>(target - count);
      out = at::cat({out, inputs.narrow(0, static_cast<std::int64_t>(length) - 1, 1).repeat(repeats)});
    }
    return out;
  } else {
    const std::size_t length = inputs.size();
    auto [begin, count] = slice_range(length);
    T out(inputs.begin() + static_cast<std::ptrdiff_t>(begin),
          inputs.begin() + static_cast<std::ptrdiff_t>(begin + count));
    const std::size_t target = (length + processes - 1) / processes;
    if (apply_padding && length > 0)
      while (out.size() < target) out.push_back(inputs.back());
    return out;
  }
}

/// This engine's process's share of `inputs` (see the overload above).
template <BackendEngine E, class T>
T split_between_processes(const E& engine, const T& inputs, bool apply_padding = false) {
  return split_between_processes(inputs, engine.rank(), engine.world_size(), apply_padding);
}

// --- agreeing on one value ---------------------------------------------------------------------

/// The lowest rank whose `flagged` is true, or -1 when none is: how the ranks agree that
/// something one of them failed alone is over for all (one small all-reduce when distributed).
/// Example:
///   if (const int failed = first_flagged_rank(engine, !ok); failed >= 0) fail("rank ", failed, " ...");
template <BackendEngine E>
int first_flagged_rank(E& engine, bool flagged) {
  int first = flagged ? engine.rank() : engine.world_size();
  if constexpr (E::distributed) {
    at::Tensor rank = at::full({1}, first, at::TensorOptions().dtype(at::kInt)).to(engine.collective_device());
    engine.all_reduce(rank, Reduction::min);
    first = rank.cpu().template item<int>();
  }
  return first < engine.world_size() ? first : -1;
}

/// Whether `flag` is true on any process, the same answer everywhere (one small all-reduce
/// when distributed): a trigger or a preemption one rank saw.
template <BackendEngine E>
bool any_process(E& engine, bool flag) {
  if constexpr (!E::distributed) {
    return flag;
  } else {
    at::Tensor value = at::tensor({flag ? 1 : 0}, at::kInt).to(engine.collective_device());
    engine.all_reduce(value, Reduction::max);
    return value.cpu().template item<int>() > 0;
  }
}

/// Rank `from`'s `value` on every process (a seed drawn on one rank for all).
template <BackendEngine E>
std::uint64_t broadcast_seed(E& engine, std::uint64_t value, int from = 0) {
  if constexpr (E::distributed) {
    at::Tensor sent = at::tensor({static_cast<std::int64_t>(value)}, at::kLong).to(engine.collective_device());
    engine.broadcast(sent, from);  // on the collective device: NCCL takes no CPU tensors
    value = static_cast<std::uint64_t>(sent.cpu().template item<std::int64_t>());
  }
  return value;
}

}  // namespace accelerate::distributed
