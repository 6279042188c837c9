// PreparedDataLoader: yields this rank's shard of batches, already on the accelerator's device,
// remembers its position (epoch, batches consumed) for exact resume, and registers each
// iteration with the accelerator's GradientState while it runs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <memory>
#include <optional>
#include <ranges>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/ArrayRef.h>

#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/data/batch.hpp>
#include <accelerate/data/batch_layout.hpp>
#include <accelerate/data/prefetcher.hpp>
#include <accelerate/data/shard_sampler.hpp>
#include <accelerate/data/staging.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/detail/linkage.hpp>
#include <accelerate/distributed/collectives.hpp>
#include <accelerate/gradient_state.hpp>
#include <accelerate/prepared/preparable.hpp>

namespace accelerate {

namespace detail {

/// Where a prepared loader stands in its epochs, as its checkpoint records it.
struct LoaderPosition {
  std::size_t epoch = 0;        // completed epochs
  std::size_t consumed = 0;     // batches yielded in the current epoch (skipped when resuming)
  std::size_t epoch_start = 0;  // positions of the epoch's order another world size consumed
};

/// How a loader's batches are dealt, for its checkpoint: a map-style source's sampler (null
/// for a range of batches) and whether each rank takes a slice of global batches.
struct LoaderSharding {
  const data::ShardSpec* sampler = nullptr;
  bool split_batches = false;
};

/// PreparedDataLoader::state_dict: the position, the world size, the samples of the epoch all
/// ranks consumed together and, with a sampler, its seed and sharding.
StateDict loader_state(const LoaderPosition& position, int world_size, std::size_t samples_consumed,
                       const LoaderSharding& sharding);

/// What PreparedDataLoader::load_state_dict restores: the position to resume at on `world_size`
/// processes and, with a sampler, the saved shuffle seed.
struct LoaderResume {
  LoaderPosition position;
  std::uint64_t seed = 0;
};

/// Checks a saved loader state against this loader's sharding and computes where it resumes;
/// an error names the first difference (see PreparedDataLoader::load_state_dict).
LoaderResume resume_loader(const StateDict& state, std::size_t world_size, const LoaderSharding& sharding);

/// What prepare compares across ranks for its `index`-th dataloader (ProcessGroupCore::
/// check_same_on_every_rank): its state as space-separated `key=value` fields (so the error
/// names the first field that differs) and, when given, its batches per rank.
struct LoaderCheck {
  std::string key;
  std::string value;
  std::string subject;
};
LoaderCheck loader_check(const StateDict& state, std::optional<std::size_t> batches_per_rank, std::size_t index);

/// One batch of a map-style dataset: its get_batch(indices) when it has one, else its
/// get(index) samples stacked by data::collate. With `name_failures` an exception from the
/// dataset becomes an accelerate::Error naming the sample (a worker's failure must say which
/// read failed: the loop sees it later, on another thread).
template <bool name_failures = false, class Dataset>
auto fetch_batch(Dataset& dataset, const std::vector<int64_t>& indices) {
  if constexpr (requires(c10::ArrayRef<int64_t> i) { dataset.get_batch(i); }) {
    if constexpr (!name_failures) {
      return dataset.get_batch(c10::ArrayRef<int64_t>(indices));
    } else {
      try {
        return dataset.get_batch(c10::ArrayRef<int64_t>(indices));
      } catch (const std::exception& e) {
        std::string samples = "the batch of samples [";
        for (std::size_t i = 0; i < indices.size() && i < 8; ++i) samples += (i ? ", " : "") + std::to_string(indices[i]);
        samples += indices.size() > 8 ? ", ...]" : "]";
        fail("dataloader worker: reading ", samples, " failed: ", e.what());
      }
    }
  } else {
    using Example = std::remove_cvref_t<decltype(dataset.get(std::size_t{0}))>;
    std::vector<Example> samples;
    samples.reserve(indices.size());
    for (const int64_t i : indices) {
      if constexpr (!name_failures) {
        samples.push_back(dataset.get(static_cast<std::size_t>(i)));
      } else {
        try {
          samples.push_back(dataset.get(static_cast<std::size_t>(i)));
        } catch (const std::exception& e) {
          fail("dataloader worker: reading sample ", i, " failed: ", e.what());
        }
      }
    }
    return data::collate(samples);
  }
}

/// Batches of a map-style dataset, dealt by a ShardSampler; with workers, read ahead by a
/// data::Prefetcher (none exists, and no thread runs, with 0 workers).
template <class Dataset>
class DatasetSource {
 public:
  using batch_type =
      decltype(fetch_batch(std::declval<Dataset&>(), std::declval<const std::vector<int64_t>&>()));
  static constexpr bool sized = true;

  /// How far ahead batches are read.
  struct Workers {
    std::size_t count = 0;
    std::size_t prefetch_factor = 2;
  };

  DatasetSource(std::shared_ptr<Dataset> dataset, const data::ShardSpec& spec, Workers workers = {})
      : dataset_(std::move(dataset)), sampler_(spec), workers_(workers) {
    ACCELERATE_CHECK(workers.count == 0 || workers.prefetch_factor > 0,
                     "DataLoaderOptions::prefetch_factor must be > 0 with num_workers = ", workers.count);
  }

  static std::size_t dataset_size(Dataset& dataset) {
    const auto size = dataset.size();
    if constexpr (requires { size.has_value(); }) {
      ACCELERATE_CHECK(size.has_value(), "prepare: a map-style dataset must report its size()");
      return *size;
    } else {
      return static_cast<std::size_t>(size);
    }
  }

  void start(std::size_t epoch, std::size_t skip) {
    stop();
    order_ = sampler_.order(epoch);
    next_ = std::min(skip, sampler_.batches_per_rank());
    if (workers_.count > 0 && next_ < size()) {
      // The workers read copies of the order and the sampler, so nothing they touch changes
      // under them (load_state_dict may re-seed the sampler while they run).
      prefetcher_ = std::make_unique<data::Prefetcher<batch_type>>(
          next_, size(), workers_.count, workers_.count * workers_.prefetch_factor,
          [dataset = dataset_, sampler = sampler_, order = order_](std::size_t k) {
            return fetch_batch</*name_failures=*/true>(*dataset, sampler.batch(order, k));
          });
    }
  }
  /// Stops and joins the workers of the current epoch (a loop left early); no-op without.
  void stop() noexcept { prefetcher_.reset(); }
  bool has_next() const noexcept { return next_ < sampler_.batches_per_rank(); }
  batch_type next() {
    if (prefetcher_) {
      ++next_;
      return prefetcher_->next();
    }
    return fetch_batch(*dataset_, sampler_.batch(order_, next_++));
  }
  std::size_t size() const noexcept { return sampler_.batches_per_rank(); }
  std::size_t remaining() const noexcept { return size() - next_; }
  /// Accelerate's remainder: real samples of the last global batch (0 with drop_last).
  std::int64_t remainder() const noexcept {
    const auto& spec = sampler_.spec();
    if (spec.drop_last) return 0;
    return static_cast<std::int64_t>(sampler_.samples() % (spec.batch_size * spec.world_size));
  }
  const data::ShardSampler& sampler() const noexcept { return sampler_; }
  void set_seed(std::uint64_t seed) noexcept {
    stop();
    sampler_.set_seed(seed);
  }
  void set_epoch_start(std::size_t start) noexcept {
    stop();
    sampler_.set_epoch_start(start);
  }
  Dataset& dataset() const noexcept { return *dataset_; }

 private:
  std::shared_ptr<Dataset> dataset_;
  data::ShardSampler sampler_;
  Workers workers_;
  std::vector<int64_t> order_;
  std::size_t next_ = 0;
  std::unique_ptr<data::Prefetcher<batch_type>> prefetcher_;
};

/// Rank `rank`'s 1/world rows of every tensor of global batch `index` (split_batches).
template <class Batch>
Batch split_rows(const Batch& batch, std::size_t world, std::size_t rank, std::size_t index) {
  return data::map_tensors(batch, [&](const at::Tensor& t) {
    ACCELERATE_CHECK(t.dim() > 0 && t.size(0) % static_cast<int64_t>(world) == 0,
                     "prepare: with data.split_batches each batch of a range is split between the ", world,
                     " processes, but batch ", index, " has a tensor of shape ", t.sizes(),
                     " whose rows do not divide by ", world);
    const int64_t rows = t.size(0) / static_cast<int64_t>(world);
    return t.narrow(0, rows * static_cast<int64_t>(rank), rows);
  });
}

/// How the ranks share a range of batches.
struct RangeSharing {
  std::size_t world_size = 1;
  std::size_t rank = 0;
  /// Each element is a global batch; each rank takes its slice of rows (split_batches).
  bool split = false;
  /// Only rank 0 reads the range and broadcasts what each rank takes (dispatch_batches).
  bool dispatch = false;
};

/// Batches of any iterable of batches. With several ranks, rank r takes element r of each
/// complete round of world_size elements (an incomplete last round is dropped, so every rank
/// gets as many batches). With `split`, each element is a global batch and rank r takes its
/// r-th 1/world_size slice of rows. Every rank reads the whole range, unless `dispatch`: then
/// rank 0 alone reads each round and broadcasts it in two messages (a header with the sizes,
/// then the layout and every tensor's bytes, data::pack_batch), and the others never iterate
/// the range (they may ask its size()); the batches are the same. One round is read ahead to
/// know which batch is the last.
template <class Range, class Engine>
class RangeSource {
  using Iterator = decltype(std::declval<Range&>().begin());

 public:
  using batch_type = std::remove_cvref_t<decltype(*std::declval<Iterator&>())>;
  static constexpr bool sized = std::ranges::sized_range<Range>;

  RangeSource(std::shared_ptr<Range> range, RangeSharing sharing, Engine* engine)
      : range_(std::move(range)), sharing_(sharing), engine_(engine) {
    if (sharing_.world_size == 1) sharing_.dispatch = false;
  }

  void start(std::size_t /*epoch*/, std::size_t skip) {
    taken_ = skip;  // remaining() counts from the resumed position (a window's length depends on it)
    if (reader()) {
      iterator_.emplace(range_->begin());
      if (sharing_.dispatch)
        for (std::size_t i = 0; i < skip && read_round(); ++i) {}  // skipped rounds are not sent
    }
    read_ahead();
    if (!sharing_.dispatch)
      for (std::size_t i = 0; i < skip && lookahead_; ++i) read_ahead();
  }
  bool has_next() const noexcept { return lookahead_.has_value(); }
  batch_type next() {
    batch_type out = std::move(*lookahead_);
    ++taken_;
    read_ahead();
    if (sharing_.split) return split_rows(out, sharing_.world_size, sharing_.rank, taken_ - 1);
    return out;
  }
  std::size_t size() const
    requires sized
  {
    return static_cast<std::size_t>(std::ranges::size(*range_)) / elements_per_batch();
  }
  std::size_t remaining() const {
    if constexpr (sized) return size() - std::min(taken_, size());
    else return 0;  // unknown
  }
  static constexpr std::int64_t remainder() noexcept { return -1; }  // unknown
  /// Elements of the range consumed for each batch this rank yields.
  std::size_t elements_per_batch() const noexcept { return sharing_.split ? 1 : sharing_.world_size; }
  bool split() const noexcept { return sharing_.split; }

 private:
  bool reader() const noexcept { return !sharing_.dispatch || sharing_.rank == 0; }
  /// The element of a round this rank takes.
  std::size_t mine() const noexcept { return sharing_.split ? 0 : sharing_.rank; }

  /// The next complete round of the range, or nothing at its end.
  std::optional<std::vector<batch_type>> read_round() {
    std::vector<batch_type> round;
    round.reserve(elements_per_batch());
    auto& it = *iterator_;
    for (std::size_t w = 0; w < elements_per_batch(); ++w) {
      if (!(it != range_->end())) return std::nullopt;  // incomplete round
      round.push_back(*it);
      ++it;
    }
    return round;
  }

  void read_ahead() {
    lookahead_.reset();
    if (sharing_.dispatch) return receive_round();
    if (auto round = read_round()) lookahead_.emplace(std::move((*round)[mine()]));
  }

  void receive_round() {
    std::optional<std::vector<batch_type>> round;
    if (sharing_.rank == 0) round = read_round();
    const auto packed = distributed::broadcast_packed(*engine_, round ? &*round : nullptr, 0);
    if (!packed) return;  // the range is exhausted
    const auto& [layout, bytes] = *packed;
    ACCELERATE_CHECK(layout.is_array() && layout.size() == elements_per_batch(), "dispatch_batches: rank 0 sent ",
                     layout.size(), " batches in a round, expected ", elements_per_batch());
    // Only this rank's element is rebuilt: the bytes of those before it are skipped.
    std::int64_t offset = 0;
    for (std::size_t e = 0; e < mine(); ++e) offset += data::packed_bytes(layout[e]);
    const std::int64_t length = data::packed_bytes(layout[mine()]);
    lookahead_.emplace(data::unpack_batch<batch_type>(layout[mine()], bytes.narrow(0, offset, length)));
  }

  std::shared_ptr<Range> range_;
  RangeSharing sharing_;
  Engine* engine_;
  std::optional<Iterator> iterator_;  // only where this rank reads the range
  std::optional<batch_type> lookahead_;
  std::size_t taken_ = 0;
};

}  // namespace detail

/// What prepare() returns for data. Iterate it with range-for (or range-v3 views); each batch is
/// this rank's next batch, on the accelerator's device. Its state (epoch, batches consumed,
/// shuffle seed) is saved by save_state, so after load_state the next batch is exactly the one
/// that would have come next. Copies share one position.
/// Example:
///   auto [loader] = acc.prepare(accelerate::DataLoader(ds, {.batch_size = 64, .shuffle = true}));
///   for (int epoch = 0; epoch < 3; ++epoch)
///     for (auto& [x, y] : loader) { ... }
template <class Source, class Acc>
class PreparedDataLoader {
  using Context = typename Acc::context_type;

  struct Shared {
    Source source;
    Context* context;
    std::size_t epoch = 0;      // completed epochs
    std::size_t consumed = 0;   // batches yielded in the current epoch
    std::size_t skip_next = 0;  // batches to skip when the next epoch starts (resume)
    // Positions of the current epoch's order consumed by a run with another world size (a
    // resharded resume); this run deals the rest. Map-style datasets only.
    std::size_t epoch_start = 0;
    std::size_t iteration = 0;  // begin() calls so far: which loop the live iterators belong to
    bool resuming = false;      // load_state_dict set the position and no loop has begun since

    void set_epoch_start(std::size_t start) {
      epoch_start = start;
      if constexpr (requires { source.set_epoch_start(start); }) source.set_epoch_start(start);
    }

    /// Positions of the current epoch's order consumed so far, by every rank together.
    std::size_t samples_consumed() const {
      if constexpr (requires { source.sampler(); }) {
        const auto& spec = source.sampler().spec();
        return std::min(spec.dataset_size, epoch_start + consumed * spec.world_size * spec.batch_size);
      } else {
        return consumed * source.elements_per_batch();  // elements of the range
      }
    }

    // On CUDA batches travel through reused page-locked buffers on a side stream (made at the
    // first batch); other devices copy directly.
    std::optional<data::DeviceStager<>> stager;

    template <class Batch>
    std::remove_cvref_t<Batch> to_device(const Batch& batch) {
      const auto device = context->device();
      if (!device.is_cuda()) return data::to_device(batch, device);
      if (!stager) stager.emplace(data::StreamTransfer(device));
      return stager->stage(batch);
    }

    std::optional<typename Source::batch_type> fetch(GradientState::Activation& activation) {
      if (!source.has_next()) {
        ++epoch;
        consumed = 0;
        set_epoch_start(0);
        activation.release();  // the loop is over: later code is outside this loader
        return std::nullopt;
      }
      auto batch = to_device(source.next());
      ++consumed;
      activation.update({!source.has_next(), source.remaining() + 1, source.remainder()});
      return batch;
    }
  };

 public:
  using batch_type = typename Source::batch_type;

  /// One loop over the loader: registered with the GradientState while it runs; when its last
  /// iterator goes (the loop ended, a `break`, an exception) the workers reading ahead for it
  /// stop, unless a newer loop has begun.
  struct Iteration {
    GradientState::Activation activation;
    Shared* shared;
    std::size_t number;
    Iteration(GradientState& state, Shared* s) : activation(state), shared(s), number(s->iteration) {}
    Iteration(const Iteration&) = delete;
    Iteration& operator=(const Iteration&) = delete;
    ~Iteration() {
      if constexpr (requires { shared->source.stop(); })
        if (shared->iteration == number) shared->source.stop();
    }
  };

  /// Range-for iterator: input iterator whose operator* is the current batch.
  class iterator {
   public:
    using value_type = batch_type;
    using reference = batch_type&;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;
    using iterator_category = std::input_iterator_tag;

    iterator() = default;
    iterator(Shared* shared, GradientState& state)
        : shared_(shared), iteration_(std::make_shared<Iteration>(state, shared)),
          current_(shared->fetch(iteration_->activation)) {}

    batch_type& operator*() const { return *current_; }
    batch_type* operator->() const { return &*current_; }
    iterator& operator++() {
      current_ = shared_->fetch(iteration_->activation);
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) noexcept {
      return !it.current_.has_value();
    }

   private:
    Shared* shared_ = nullptr;
    // Shared by copies of the iterator; the last one destroyed ends the registration (a
    // `break` out of the loop) and stops the workers.
    std::shared_ptr<Iteration> iteration_;
    mutable std::optional<batch_type> current_;
  };

  PreparedDataLoader(Source source, Context* context)
      : shared_(std::make_shared<Shared>(Shared{std::move(source), context})) {}

  /// Starts (or, after load_state / skip_first_batches, resumes) the current epoch.
  iterator begin() {
    auto& s = *shared_;
    ++s.iteration;
    s.resuming = false;
    s.source.start(s.epoch, s.skip_next);
    s.consumed = s.skip_next;
    s.skip_next = 0;
    return iterator(&s, s.context->gradient_state());
  }
  std::default_sentinel_t end() const noexcept { return {}; }

  /// Batches per epoch on this rank.
  std::size_t size() const
    requires Source::sized
  {
    return shared_->source.size();
  }

  /// The epoch the next iteration runs (epochs completed so far).
  std::size_t epoch() const noexcept { return shared_->epoch; }
  /// Batches already yielded in the current epoch.
  std::size_t batches_consumed() const noexcept { return shared_->consumed; }
  /// Sets the epoch the next iteration runs, which fixes its shuffle (Accelerate's set_epoch).
  /// After load_state, naming the epoch it resumes keeps the position it restored (a loop that
  /// calls set_epoch at the top of every epoch, as Transformers' Trainer does, resumes where
  /// the checkpoint was taken, on this number of processes or another); naming another epoch
  /// starts that epoch from its beginning.
  void set_epoch(std::size_t epoch) noexcept {
    auto& s = *shared_;
    if (s.resuming && epoch == s.epoch) return;
    if (s.resuming) s.skip_next = 0;  // the restored position belongs to the resumed epoch
    s.resuming = false;
    s.epoch = epoch;
    s.consumed = 0;
    s.set_epoch_start(0);
  }
  /// The next iteration skips its first `n` batches (this epoch only); returns this loader.
  PreparedDataLoader& skip_first_batches(std::size_t n) noexcept {
    shared_->skip_next = n;
    return *this;
  }
  /// The underlying source (dataset and sampler, or the range).
  Source& source() const noexcept { return shared_->source; }

  /// {epoch, batches consumed, world size, samples of the epoch consumed by all ranks together
  /// and, for datasets, where this epoch began, the shuffle seed and sharding}.
  StateDict state_dict() const {
    const auto& sh = *shared_;
    return detail::loader_state({sh.epoch, sh.consumed, sh.epoch_start}, sh.context->num_processes(),
                                sh.samples_consumed(), sharding());
  }

  /// Restores the position; the next begin() resumes after the last consumed batch. A state
  /// taken with another dataset size, batch size, shuffle, drop_last, even_batches or
  /// split_batches (the batch order would differ) is an error naming both values; nothing
  /// changes before every value is checked.
  ///
  /// A state saved by another number of processes resumes by samples: the positions of the
  /// epoch's order that all ranks together consumed are skipped, and the rest of the epoch is
  /// dealt over this run's ranks under the loader's tail rule (each sample once when the
  /// samples left divide by ranks x batch size; else even_batches wraps around to the first
  /// ones left, drop_last skips the incomplete last round); the epochs after it are a fresh
  /// run's. A range of batches (no sampler) resumes on another world size only when
  /// the batches consumed are whole rounds of this world size.
  void load_state_dict(const StateDict& s) {
    auto& sh = *shared_;
    const auto resumed = detail::resume_loader(s, static_cast<std::size_t>(sh.context->num_processes()), sharding());
    if constexpr (requires { sh.source.sampler(); }) sh.source.set_seed(resumed.seed);
    sh.epoch = resumed.position.epoch;
    sh.set_epoch_start(resumed.position.epoch_start);
    sh.consumed = resumed.position.consumed;
    sh.skip_next = resumed.position.consumed;
    sh.resuming = true;
  }

 private:
  detail::LoaderSharding sharding() const {
    const auto& source = shared_->source;
    if constexpr (requires { source.sampler(); }) return {&source.sampler().spec(), source.sampler().spec().split_batches};
    else return {nullptr, source.split()};
  }

  std::shared_ptr<Shared> shared_;
};

/// Makes the loader's next iteration skip its first `n` batches (Accelerate's
/// skip_first_batches); the epoch and shuffle are the loader's current ones.
template <class Source, class Acc>
PreparedDataLoader<Source, Acc>& skip_first_batches(PreparedDataLoader<Source, Acc>& loader,
                                                    std::size_t n) {
  return loader.skip_first_batches(n);
}

}  // namespace accelerate

#if !defined(ACCELERATE_SEPARATE_COMPILATION)
#include <accelerate/prepared/dataloader.ipp>
#endif
