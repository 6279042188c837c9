// The conformance cases every BackendEngine passes: its primitives (ranks, all_reduce of each
// reduction, broadcast, all_gather, reduce_scatter, barrier, stats, check_same_on_every_rank)
// and the collectives built on them (nested containers, uneven sizes, padding, objects,
// splitting, mismatches named on every rank). Each case is written once for any engine, any
// world size (1 included) and any collective device; what runs them is elsewhere:
//   tests/distributed/engine_conformance_test.cpp  every CPU engine (threads, Gloo processes)
//   tests/gpu/nccl_train.cpp --conformance         NCCL's engines, one process per GPU
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include <accelerate/detail/check.hpp>
#include <accelerate/distributed/collectives.hpp>
#include <accelerate/distributed/engine.hpp>
#include <accelerate/distributed/reduction.hpp>
#include <accelerate/distributed/stats.hpp>

namespace accelerate::testing::conformance {

namespace dist = accelerate::distributed;
using accelerate::CommStats;
using accelerate::Reduction;

// A failed expectation in a case: thrown, so that it works the same in a thread, in this
// process and in a worker process (where it becomes the exit code and the log).
#define CONFORM(condition, what)                                                                  \
  do {                                                                                            \
    if (!(condition))                                                                             \
      throw std::runtime_error(std::string(__FILE__ ":") + std::to_string(__LINE__) + ": rank " + \
                               std::to_string(engine.rank()) + ": " + (what) + " (" #condition ")"); \
  } while (false)

inline bool same(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && at::equal(a, b); }

// --- the cases -------------------------------------------------------------------------------

template <class E>
void ranks_and_devices(E& engine) {
  CONFORM(engine.world_size() >= 1, "a world of at least one process");
  CONFORM(engine.rank() >= 0 && engine.rank() < engine.world_size(), "rank within the world");
  CONFORM(engine.local_rank() >= 0 && engine.local_rank() < engine.local_world_size(), "local rank within the node");
  CONFORM(engine.local_world_size() <= engine.world_size(), "a node holds at most the world");
  CONFORM(E::distributed || engine.world_size() == 1, "an engine that talks to nobody has one process");
  const auto ranks = dist::gather_object(engine, engine.rank());
  CONFORM(static_cast<int>(ranks.size()) == engine.world_size(), "one answer per rank");
  for (int r = 0; r < engine.world_size(); ++r) CONFORM(ranks[static_cast<std::size_t>(r)] == r, "ranks in order");
}

template <class E>
void all_reduce_each_reduction(E& engine) {
  const int world = engine.world_size();
  const double value = engine.rank() + 1;
  auto reduced = [&](Reduction reduction) {
    at::Tensor t = at::full({3}, value, at::kDouble).to(engine.collective_device());
    engine.all_reduce(t, reduction);
    return t.cpu();
  };
  CONFORM(same(reduced(Reduction::sum), at::full({3}, world * (world + 1) / 2.0, at::kDouble)), "sum");
  CONFORM(same(reduced(Reduction::mean), at::full({3}, (world + 1) / 2.0, at::kDouble)), "mean");
  CONFORM(same(reduced(Reduction::max), at::full({3}, double(world), at::kDouble)), "max");
  CONFORM(same(reduced(Reduction::min), at::full({3}, 1.0, at::kDouble)), "min");
  at::Tensor integer = at::full({2}, engine.rank() * 2 + 1, at::kLong).to(engine.collective_device());
  engine.all_reduce(integer, Reduction::mean);  // integers: floor of the mean (world squared over world)
  CONFORM(integer.cpu()[0].item<std::int64_t>() == world, "integer mean");
}

template <class E>
void broadcast_and_all_gather(E& engine) {
  const int world = engine.world_size(), last = world - 1;
  at::Tensor t = at::full({2, 2}, float(engine.rank()), at::kFloat).to(engine.collective_device());
  engine.broadcast(t, last);
  CONFORM(same(t.cpu(), at::full({2, 2}, float(last))), "broadcast from the last rank");
  const at::Tensor mine = (at::arange(3, at::kLong) + 10 * engine.rank()).to(engine.collective_device());
  const auto parts = engine.all_gather(mine);
  CONFORM(static_cast<int>(parts.size()) == world, "all_gather: one part per rank");
  for (int r = 0; r < world; ++r)
    CONFORM(same(parts[static_cast<std::size_t>(r)].cpu(), at::arange(3, at::kLong) + 10 * r), "all_gather order");
}

template <class E>
void reduce_scatter_slices(E& engine) {
  const int world = engine.world_size(), rank = engine.rank();
  const at::Tensor input = (at::arange(world * 2 * 3, at::kFloat).reshape({world * 2, 3}) + rank).to(engine.collective_device());
  const at::Tensor sum = engine.reduce_scatter(input, Reduction::sum).cpu();
  const at::Tensor full_sum = at::arange(world * 2 * 3, at::kFloat).reshape({world * 2, 3}) * world +
                              world * (world - 1) / 2.0;
  CONFORM(same(sum, full_sum.narrow(0, 2 * rank, 2)), "reduce_scatter sum: this rank's slice of the sum");
  const at::Tensor mean = engine.reduce_scatter(input, Reduction::mean).cpu();
  CONFORM(at::allclose(mean, (full_sum / world).narrow(0, 2 * rank, 2)), "reduce_scatter mean");
  CONFORM(input.cpu().equal(at::arange(world * 2 * 3, at::kFloat).reshape({world * 2, 3}) + rank),
          "reduce_scatter leaves its input unchanged");
}

template <class E>
void barrier_and_stats(E& engine) {
  const CommStats before = engine.stats();
  engine.barrier();
  at::Tensor t = at::ones({4}, at::kFloat).to(engine.collective_device());
  engine.all_reduce(t, Reduction::sum);
  engine.broadcast(t, 0);
  (void)engine.all_gather(t);
  (void)engine.reduce_scatter(at::ones({engine.world_size() * 2}, at::kFloat).to(engine.collective_device()),
                              Reduction::sum);
  const CommStats after = engine.stats();
  if constexpr (E::distributed) {
    CONFORM(after.barrier.calls == before.barrier.calls + 1, "a barrier is counted");
    CONFORM(after.allreduce.calls == before.allreduce.calls + 1 && after.allreduce.bytes == before.allreduce.bytes + 16,
            "an all_reduce of 4 floats is counted as 16 bytes");
    CONFORM(after.broadcast.calls == before.broadcast.calls + 1, "a broadcast is counted");
    CONFORM(after.allgather.calls == before.allgather.calls + 1, "an all_gather is counted");
    CONFORM(after.reduce_scatter.calls == before.reduce_scatter.calls + 1 &&
                after.reduce_scatter.bytes == before.reduce_scatter.bytes + 8u * engine.world_size(),
            "a reduce_scatter is counted with its input's bytes");
  } else {
    CONFORM(after == CommStats{}, "an engine of one process moves nothing");
  }
}

template <class E>
void check_same_on_every_rank(E& engine) {
  engine.check_same_on_every_rank("conformance/same", "batch_size=4", "the same value");
  if (engine.world_size() == 1) return;
  std::string message = "no error";
  try {
    engine.check_same_on_every_rank("conformance/differs", engine.rank() == 1 ? "batch_size=5" : "batch_size=4",
                                    "loader");
  } catch (const accelerate::Error& e) {
    message = e.what();
  }
  CONFORM(message.find("loader") != std::string::npos, "a difference is an error on every rank: " + message);
}

template <class E>
void collectives_on_nested_containers(E& engine) {
  const int world = engine.world_size(), rank = engine.rank();
  const auto device = engine.collective_device();
  using Nested = std::tuple<at::Tensor, std::vector<at::Tensor>, std::map<std::string, at::Tensor>>;
  const Nested mine{at::full({1, 2}, float(rank), device),
                    {at::full({2}, float(rank), device), at::full({1}, float(10 + rank), device)},
                    {{"loss", at::full({1}, float(rank), device)}}};
  const Nested gathered = dist::gather(engine, mine);
  CONFORM(std::get<0>(gathered).size(0) == world, "gather: one row per rank");
  CONFORM(std::get<1>(gathered)[0].size(0) == 2 * world, "gather inside a vector");
  CONFORM(std::get<2>(gathered).at("loss").size(0) == world, "gather inside a map");
  for (int r = 0; r < world; ++r)
    CONFORM(std::get<1>(gathered)[1].cpu()[r].item<float>() == 10 + r, "gathered in rank order");
  const Nested summed = dist::reduce(engine, mine, Reduction::sum);
  CONFORM(std::get<2>(summed).at("loss").cpu().item<float>() == world * (world - 1) / 2.0f, "reduce inside a map");
  const Nested sent = dist::broadcast(engine, mine, world - 1);
  CONFORM(std::get<1>(sent)[1].cpu().item<float>() == 10 + world - 1, "broadcast inside a vector");
}

template <class E>
void uneven_sizes_padding_objects_and_splits(E& engine) {
  const int world = engine.world_size(), rank = engine.rank();
  const auto device = engine.collective_device();
  // Rank r holds r + 1 rows of r.
  const at::Tensor rows = at::full({rank + 1, 2}, float(rank), device);
  const at::Tensor all = dist::gather(engine, rows).cpu();
  CONFORM(all.size(0) == world * (world + 1) / 2, "uneven gather keeps every row");
  CONFORM(all[all.size(0) - 1][0].item<float>() == world - 1, "the last rows are the last rank's");
  const at::Tensor padded = dist::pad_across_processes(engine, rows, 0, -1.0, /*pad_first=*/true);
  CONFORM(padded.size(0) == world, "padded to the largest size");
  CONFORM(padded.cpu()[0][0].item<float>() == (rank + 1 == world ? float(rank) : -1.0f), "pad_first pads before");
  const auto names = dist::gather_object(engine, std::string("rank ") + std::to_string(rank));
  CONFORM(static_cast<int>(names.size()) == world && names.back() == "rank " + std::to_string(world - 1),
          "gather_object in rank order");
  const auto config = dist::broadcast_object(engine, std::map<std::string, int>{{"from", rank}}, world - 1);
  CONFORM(config.at("from") == world - 1, "broadcast_object from the last rank");
  std::vector<int> items(10);
  for (int i = 0; i < 10; ++i) items[static_cast<std::size_t>(i)] = i;
  std::vector<int> back;
  for (const auto& part : dist::gather_object(engine, dist::split_between_processes(engine, items)))
    back.insert(back.end(), part.begin(), part.end());
  CONFORM(back == items, "split_between_processes: every item once, in order");
}

template <class E>
void mismatches_are_errors_on_every_rank(E& engine) {
  if (engine.world_size() == 1) return;
  std::string message = "no error";
  try {
    (void)dist::reduce(engine, at::zeros({engine.rank() == 1 ? 4 : 3}, engine.collective_device()));
  } catch (const accelerate::Error& e) {
    message = e.what();
  }
  CONFORM(message.find("rank 0 passes") != std::string::npos && message.find("rank 1 passes") != std::string::npos,
          "a mismatched reduce names rank 0 and the differing rank: " + message);
  // The group is intact afterwards.
  const at::Tensor one = dist::reduce(engine, at::ones({1}, engine.collective_device()));
  CONFORM(one.cpu().item<float>() == engine.world_size(), "a matching collective after the error works");
}

// One list of the cases: the typed tests and the workers of every runner are made from it.
template <class E>
void flags_and_seeds_agree(E& engine) {
  const int last = engine.world_size() - 1;
  CONFORM(dist::first_flagged_rank(engine, false) == -1, "no rank flagged: -1 everywhere");
  CONFORM(dist::first_flagged_rank(engine, engine.rank() == last) == last, "the flagged rank, everywhere");
  CONFORM(dist::first_flagged_rank(engine, true) == 0, "every rank flagged: the lowest, 0");
  CONFORM(!dist::any_process(engine, false), "no process: false everywhere");
  CONFORM(dist::any_process(engine, engine.rank() == last), "one process is enough, everywhere");
  const std::uint64_t seed = 1000 + static_cast<std::uint64_t>(engine.rank());
  CONFORM(dist::broadcast_seed(engine, seed, last) == 1000 + static_cast<std::uint64_t>(last),
          "the sender's seed everywhere");
}

#define ACCELERATE_CONFORMANCE_CASES(X)                                  \
  X(RanksAndDevices, ranks_and_devices)                                  \
  X(AllReduceEachReduction, all_reduce_each_reduction)                   \
  X(BroadcastAndAllGather, broadcast_and_all_gather)                     \
  X(ReduceScatterSlices, reduce_scatter_slices)                          \
  X(BarrierAndStats, barrier_and_stats)                                  \
  X(CheckSameOnEveryRank, check_same_on_every_rank)                      \
  X(CollectivesOnNestedContainers, collectives_on_nested_containers)     \
  X(UnevenSizesPaddingObjectsAndSplits, uneven_sizes_padding_objects_and_splits) \
  X(MismatchesAreErrorsOnEveryRank, mismatches_are_errors_on_every_rank)          \
  X(FlagsAndSeedsAgree, flags_and_seeds_agree)

}  // namespace accelerate::testing::conformance
