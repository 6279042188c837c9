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
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/ArrayRef.h>

#include <accelerate/checkpoint/stateful.hpp>
#include <accelerate/data/batch.hpp>
#include <accelerate/data/shard_sampler.hpp>
#include <accelerate/detail/check.hpp>
#include <accelerate/gradient_state.hpp>
#include <accelerate/prepared/preparable.hpp>

namespace accelerate {

namespace detail {

/// One batch of a map-style dataset: its get_batch(indices) when it has one, else its
/// get(index) samples stacked by data::collate.
template <class Dataset>
auto fetch_batch(Dataset& dataset, const std::vector<int64_t>& indices) {
  if constexpr (requires(c10::ArrayRef<int64_t> i) { dataset.get_batch(i); }) {
    return dataset.get_batch(c10::ArrayRef<int64_t>(indices));
  } else {
    using Example = std::remove_cvref_t<decltype(dataset.get(std::size_t{0}))>;
    std::vector<Example> samples;
    samples.reserve(indices.size());
    for (const int64_t i : indices) samples.push_back(dataset.get(static_cast<std::size_t>(i)));
    return data::collate(samples);
  }
}

/// Batches of a map-style dataset, dealt by a ShardSampler.
template <class Dataset>
class DatasetSource {
 public:
  using batch_type =
      decltype(fetch_batch(std::declval<Dataset&>(), std::declval<const std::vector<int64_t>&>()));
  static constexpr bool sized = true;

  DatasetSource(std::shared_ptr<Dataset> dataset, const data::ShardSpec& spec)
      : dataset_(std::move(dataset)), sampler_(spec) {}

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
    order_ = sampler_.order(epoch);
    next_ = std::min(skip, sampler_.batches_per_rank());
  }
  bool has_next() const noexcept { return next_ < sampler_.batches_per_rank(); }
  batch_type next() { return fetch_batch(*dataset_, sampler_.batch(order_, next_++)); }
  std::size_t size() const noexcept { return sampler_.batches_per_rank(); }
  std::size_t remaining() const noexcept { return size() - next_; }
  /// Accelerate's remainder: real samples of the last global batch (0 with drop_last).
  std::int64_t remainder() const noexcept {
    const auto& spec = sampler_.spec();
    if (spec.drop_last) return 0;
    return static_cast<std::int64_t>(sampler_.samples() % (spec.batch_size * spec.world_size));
  }
  const data::ShardSampler& sampler() const noexcept { return sampler_; }
  void set_seed(std::uint64_t seed) noexcept { sampler_.set_seed(seed); }
  void set_epoch_start(std::size_t start) noexcept { sampler_.set_epoch_start(start); }
  Dataset& dataset() const noexcept { return *dataset_; }

 private:
  std::shared_ptr<Dataset> dataset_;
  data::ShardSampler sampler_;
  std::vector<int64_t> order_;
  std::size_t next_ = 0;
};

/// Batches of any iterable of batches. With several ranks, rank r takes element r of each
/// complete round of world_size elements (an incomplete last round is dropped, so every rank
/// gets as many batches). One element is read ahead to know which batch is the last.
template <class Range>
class RangeSource {
  using Iterator = decltype(std::declval<Range&>().begin());
  using Sentinel = decltype(std::declval<Range&>().end());

 public:
  using batch_type = std::remove_cvref_t<decltype(*std::declval<Iterator&>())>;
  static constexpr bool sized = std::ranges::sized_range<Range>;

  RangeSource(std::shared_ptr<Range> range, std::size_t world_size, std::size_t rank)
      : range_(std::move(range)), world_size_(world_size), rank_(rank) {}

  void start(std::size_t /*epoch*/, std::size_t skip) {
    iterator_.emplace(range_->begin());
    taken_ = 0;
    read_ahead();
    for (std::size_t i = 0; i < skip && lookahead_; ++i) read_ahead();
  }
  bool has_next() const noexcept { return lookahead_.has_value(); }
  batch_type next() {
    batch_type out = std::move(*lookahead_);
    ++taken_;
    read_ahead();
    return out;
  }
  std::size_t size() const
    requires sized
  {
    return static_cast<std::size_t>(std::ranges::size(*range_)) / world_size_;
  }
  std::size_t remaining() const {
    if constexpr (sized) return size() - taken_;
    else return 0;  // unknown
  }
  static constexpr std::int64_t remainder() noexcept { return -1; }  // unknown

 private:
  void read_ahead() {
    lookahead_.reset();
    std::optional<batch_type> mine;
    auto& it = *iterator_;
    for (std::size_t w = 0; w < world_size_; ++w) {
      if (!(it != range_->end())) return;  // incomplete round
      if (w == rank_) mine.emplace(*it);
      ++it;
    }
    lookahead_ = std::move(mine);
  }

  std::shared_ptr<Range> range_;
  std::size_t world_size_;
  std::size_t rank_;
  std::optional<Iterator> iterator_;
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
        return consumed * static_cast<std::size_t>(context->num_processes());  // elements of the range
      }
    }

    std::optional<typename Source::batch_type> fetch(GradientState::Activation& activation) {
      if (!source.has_next()) {
        ++epoch;
        consumed = 0;
        set_epoch_start(0);
        activation.release();  // the loop is over: later code is outside this loader
        return std::nullopt;
      }
      auto batch = data::to_device(source.next(), context->device(), /*non_blocking=*/true);
      ++consumed;
      activation.update({!source.has_next(), source.remaining() + 1, source.remainder()});
      return batch;
    }
  };

 public:
  using batch_type = typename Source::batch_type;

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
        : shared_(shared), activation_(std::make_shared<GradientState::Activation>(state)),
          current_(shared->fetch(*activation_)) {}

    batch_type& operator*() const { return *current_; }
    batch_type* operator->() const { return &*current_; }
    iterator& operator++() {
      current_ = shared_->fetch(*activation_);
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) noexcept {
      return !it.current_.has_value();
    }

   private:
    Shared* shared_ = nullptr;
    // Shared by copies of the iterator; the last one destroyed ends the registration (a
    // `break` out of the loop).
    std::shared_ptr<GradientState::Activation> activation_;
    mutable std::optional<batch_type> current_;
  };

  PreparedDataLoader(Source source, Context* context)
      : shared_(std::make_shared<Shared>(Shared{std::move(source), context})) {}

  /// Starts (or, after load_state / skip_first_batches, resumes) the current epoch.
  iterator begin() {
    auto& s = *shared_;
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
  void set_epoch(std::size_t epoch) noexcept {
    shared_->epoch = epoch;
    shared_->consumed = 0;
    shared_->set_epoch_start(0);
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
    StateDict s;
    const auto& sh = *shared_;
    s.values = {{"epoch", sh.epoch}, {"batches_consumed", sh.consumed},
                {"world_size", sh.context->num_processes()}, {"samples_consumed", sh.samples_consumed()},
                {"epoch_start", sh.epoch_start}};
    if constexpr (requires { sh.source.sampler(); }) {
      const auto& spec = sh.source.sampler().spec();
      s.values["seed"] = spec.seed;
      s.values["dataset_size"] = spec.dataset_size;
      s.values["batch_size"] = spec.batch_size;
      s.values["shuffle"] = spec.shuffle;
      s.values["drop_last"] = spec.drop_last;
      s.values["even_batches"] = spec.even_batches;
    }
    return s;
  }

  /// Restores the position; the next begin() resumes after the last consumed batch. A state
  /// taken with another dataset size, batch size, shuffle, drop_last or even_batches (the
  /// batch order would differ) is an error naming both values; nothing changes before every
  /// value is checked.
  ///
  /// A state saved by another number of processes resumes by samples: the positions of the
  /// epoch's order that all ranks together consumed are skipped, and the rest of the epoch is
  /// dealt over this run's ranks, so no sample is repeated or skipped; the epochs after it are
  /// a fresh run's. A range of batches (no sampler) resumes on another world size only when
  /// the batches consumed are whole rounds of this world size.
  void load_state_dict(const StateDict& s) {
    auto& sh = *shared_;
    const auto world = s.value<std::size_t>("world_size");
    const auto here = static_cast<std::size_t>(sh.context->num_processes());
    const auto epoch = s.value<std::size_t>("epoch");
    const auto consumed = s.value<std::size_t>("batches_consumed");
    std::size_t skip = consumed, epoch_start = 0;
    if constexpr (requires { sh.source.sampler(); }) {
      const auto& spec = sh.source.sampler().spec();
      const auto dataset_size = s.value<std::size_t>("dataset_size");
      const auto batch_size = s.value<std::size_t>("batch_size");
      ACCELERATE_CHECK(dataset_size == spec.dataset_size && batch_size == spec.batch_size,
                       "dataloader state: saved for a dataset of ", dataset_size,
                       " samples in batches of ", batch_size, ", this loader has ",
                       spec.dataset_size, " samples in batches of ", spec.batch_size);
      // States written before these were recorded lack them.
      for (const auto& [key, mine] : {std::pair{"shuffle", spec.shuffle}, std::pair{"drop_last", spec.drop_last},
                                      std::pair{"even_batches", spec.even_batches}}) {
        if (!s.values.contains(key)) continue;
        const bool saved = s.value<bool>(key);
        ACCELERATE_CHECK(saved == mine, "dataloader state: saved with ", key, " = ", saved ? "true" : "false",
                         ", this loader has ", key, " = ", mine ? "true" : "false",
                         " (the batch order would differ)");
      }
      const auto saved_start = s.values.contains("epoch_start") ? s.value<std::size_t>("epoch_start") : 0;
      ACCELERATE_CHECK(saved_start <= dataset_size, "dataloader state: epoch_start ", saved_start,
                       " is past the dataset's ", dataset_size, " samples");
      if (world == here) {
        epoch_start = saved_start;
        data::ShardSampler trial(spec);
        trial.set_epoch_start(epoch_start);
        ACCELERATE_CHECK(consumed <= trial.batches_per_rank(), "dataloader state: ", consumed,
                         " batches consumed, but an epoch of this loader has ", trial.batches_per_rank());
      } else {
        epoch_start = s.values.contains("samples_consumed")
                          ? s.value<std::size_t>("samples_consumed")
                          : std::min(dataset_size, saved_start + consumed * world * batch_size);
        ACCELERATE_CHECK(epoch_start <= dataset_size, "dataloader state: ", epoch_start,
                         " samples consumed, but the dataset has ", dataset_size);
        skip = 0;
      }
      sh.source.set_seed(s.value<std::uint64_t>("seed"));
    } else if (world != here) {
      ACCELERATE_CHECK(consumed * world % here == 0, "dataloader state: saved by ", world, " processes after ",
                       consumed, " batches each (", consumed * world, " batches of the range); this run has ",
                       here, " processes, which cannot resume there: a range of batches is dealt in rounds of ",
                       here, " (prepare a map-style dataset to resume anywhere)");
      skip = consumed * world / here;
    }
    sh.epoch = epoch;
    sh.set_epoch_start(epoch_start);
    sh.consumed = skip;
    sh.skip_next = skip;
  }

 private:
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
