// Tests of include/accelerate/distributed/communicator.hpp over real Gloo processes: its
// reduce-scatter (an all-to-all summing in rank order) and broadcast_flat's bounded pieces.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../support/prelude.hpp"

namespace {

using namespace accelerate::testing::prelude;
using Acc = accelerate::Accelerator<accelerate::Gloo>;

ACCELERATE_WORKER(broadcast_flat_pieces) {
  Acc acc{{.process_group = {.timeout = 60s}}};
  const int rank = acc.process_index();
  auto& comm = *acc.engine().communicator();
  // Rank r's tensor k holds 100 * r + k + its element index, so rank 0's are known everywhere.
  auto make = [](int of_rank) {
    const double r = 100.0 * of_rank;
    return std::vector<at::Tensor>{
        torch::arange(10, torch::kFloat) + r,                         // 40 B
        torch::arange(10, torch::kFloat) + r + 1,                     // 40 B
        torch::arange(20, torch::kFloat) + r + 2,                     // 80 B
        (torch::arange(20, torch::kFloat) + r + 3).view({4, 5}).t(),  // 80 B, not contiguous
        torch::zeros({0}, torch::kFloat),                             // nothing
        torch::arange(50, torch::kFloat) + r + 5,                     // 200 B
        torch::arange(3, torch::kDouble) + r + 6};                    // 24 B, another dtype
  };
  const std::vector<at::Tensor> rank0 = make(0);
  // Float pieces of at most 100 bytes: {0, 1}, {2}, {3}, {5}; then the double {6}.
  for (const auto& [piece_bytes, calls] : std::vector<std::pair<std::size_t, std::uint64_t>>{{100, 5}, {64u << 20, 2}}) {
    auto tensors = make(rank);
    const auto before = acc.stats().broadcast.calls;
    accelerate::distributed::broadcast_flat(comm, tensors, 0, piece_bytes);
    const auto sent = acc.stats().broadcast.calls - before;
    if (sent != calls) {
      std::cerr << "pieces of " << piece_bytes << " B: " << sent << " broadcasts, expected " << calls << std::endl;
      return 1;
    }
    for (std::size_t k = 0; k < tensors.size(); ++k)
      if (!torch::equal(tensors[k], rank0[k])) {
        std::cerr << "pieces of " << piece_bytes << " B: tensor " << k << " differs from rank 0's" << std::endl;
        return 2;
      }
  }
  return 0;
}

// Gloo's reduce-scatter as an all-to-all: every element of every slice is the sum of the
// ranks' values added in rank order, bit for bit, whatever the slice (c10d's own Gloo
// reduce-scatter is a ring all-reduce, which starts each chunk's sum at another rank). Values
// of mixed magnitudes, so that another order rounds differently for many elements; the
// asynchronous form used by gradient buckets, and the input left as it was.
ACCELERATE_WORKER(reduce_scatter_rank_order) {
  Acc acc{{.process_group = {.timeout = 60s}}};
  const int rank = acc.process_index(), world = acc.num_processes();
  auto& comm = *acc.engine().communicator();
  auto values_of = [&](int of_rank) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + of_rank);
    return at::randn({world * 4099}, gen) * at::pow(10.0, at::randint(-4, 5, {world * 4099}, gen));
  };
  at::Tensor input = values_of(rank);
  const at::Tensor before = input.clone();
  at::Tensor expected = values_of(0);
  for (int r = 1; r < world; ++r) expected = expected + values_of(r);
  at::Tensor output = at::empty({4099});
  const auto calls = acc.stats().reduce_scatter.calls;
  auto work = comm.reduce_scatter_async(input, output);
  comm.wait(work, "reduce_scatter");
  const at::Tensor mine = expected.narrow(0, rank * 4099, 4099);
  const auto differing = output.ne(mine).sum().item<int64_t>();
  if (differing != 0) {
    std::cerr << differing << " of 4099 elements differ from the rank-order sum" << std::endl;
    return 1;
  }
  if (!torch::equal(input, before)) return 2;
  if (acc.stats().reduce_scatter.calls != calls + 1) return 3;
  // The synchronous form, with a mean and more than one dimension.
  const at::Tensor mean = comm.reduce_scatter(input.view({world * 4099, 1}), accelerate::Reduction::mean);
  if (!torch::allclose(mean.view(-1), mine / world)) return 4;
  // c10d's own Gloo reduce-scatter, chosen by the option: the same sums up to rounding.
  Acc c10d_acc{{.process_group = {.timeout = 60s, .reduce_scatter_all_to_all = false}}};
  auto& c10d_comm = *c10d_acc.engine().communicator();
  at::Tensor ring = at::empty({4099});
  auto ring_work = c10d_comm.reduce_scatter_async(input, ring);
  c10d_comm.wait(ring_work, "reduce_scatter");
  if (!torch::allclose(ring, mine, 1e-5, 1e-3)) return 5;
  return 0;
}

TEST(Communicator, GlooReduceScatterSumsEachElementInRankOrder) {
  for (int world : {2, 3}) {
    auto job = run_job("reduce_scatter_rank_order", {.world_size = world});
    EXPECT_EQ(job.exit_code, 0) << "world " << world << "\n" << job.logs();
  }
}

TEST(Communicator, BroadcastFlatSendsRankZerosValuesInBoundedPieces) {
  for (int world : {2, 3}) {
    auto job = run_job("broadcast_flat_pieces", {.world_size = world});
    EXPECT_EQ(job.exit_code, 0) << "world " << world << "\n" << job.logs();
  }
}

}  // namespace
