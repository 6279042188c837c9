// Collectives on the Accelerator with real processes: gather_for_metrics on uneven datasets,
// pad_across_processes, broadcast and reduce of nested containers, split_between_processes,
// main_process_first, and the rendezvous's failure modes.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <thread>

#include "../support/prelude.hpp"

namespace {

using namespace accelerate::testing::prelude;
using Acc = accelerate::Accelerator<accelerate::Gloo>;

int dataset_size_from_args() {
  const char* args = std::getenv("ACCELERATE_TEST_ARGS");
  return args ? std::atoi(args) : 10;
}

ACCELERATE_WORKER(gather_for_metrics) {
  Acc acc{{.process_group = {.timeout = 60s}}};
  const int n = dataset_size_from_args();
  auto ids = torch::arange(n, torch::kFloat).unsqueeze(1);
  auto [loader] = acc.prepare(accelerate::DataLoader(accelerate::data::TensorDataset(ids, torch::arange(n)),
                                                     {.batch_size = 2, .shuffle = true, .seed = 3}));
  std::vector<torch::Tensor> seen;
  for (auto& [x, y] : loader) seen.push_back(acc.gather_for_metrics(y));
  if (acc.is_main_process()) save_tensor(job_dir() / "gathered.bin", torch::cat(seen));
  return 0;
}

// Results concatenated per rank during the loop and gathered after it: nothing is dropped,
// since no loader is being iterated any more (the last batch's remainder must not stick).
ACCELERATE_WORKER(gather_for_metrics_after_loop) {
  Acc acc{{.process_group = {.timeout = 60s}}};
  const int n = dataset_size_from_args();
  auto ids = torch::arange(n, torch::kFloat).unsqueeze(1);
  auto [loader] = acc.prepare(accelerate::DataLoader(accelerate::data::TensorDataset(ids, torch::arange(n)),
                                                     {.batch_size = 2}));
  std::vector<torch::Tensor> mine;
  for (auto& [x, y] : loader) mine.push_back(y);
  const auto gathered = acc.gather_for_metrics(torch::cat(mine));
  if (acc.is_main_process()) save_tensor(job_dir() / "gathered.bin", gathered);
  return 0;
}

TEST(GatherForMetricsAfterLoop, KeepsEveryRowOfEveryRank) {
  auto job = run_job("gather_for_metrics_after_loop", {.world_size = 2, .args = {"10"}});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  // Each rank saw 3 batches of 2 (the last round of 4 holds 2 real samples and 2 repeats).
  EXPECT_EQ(load_tensor(job.dir / "gathered.bin").numel(), 12);
}

// Object collectives: strings, maps and vectors travel as JSON; gather_for_metrics of a vector
// of non-tensor values drops the duplicated samples like the tensor path.
ACCELERATE_WORKER(object_collectives) {
  Acc acc{{.process_group = {.timeout = 60s}}};
  const int rank = acc.process_index();
  const auto names = acc.gather_object(std::string("rank ") + std::to_string(rank));
  const auto config = acc.broadcast_object(std::map<std::string, double>{{"lr", rank == 0 ? 0.5 : -1.0}});
  const int n = 10;
  auto ids = torch::arange(n, torch::kFloat).unsqueeze(1);
  auto [loader] = acc.prepare(accelerate::DataLoader(accelerate::data::TensorDataset(ids, torch::arange(n)),
                                                     {.batch_size = 2}));
  std::vector<std::int64_t> seen;
  for (auto& [x, y] : loader) {
    std::vector<std::int64_t> labels(y.data_ptr<std::int64_t>(), y.data_ptr<std::int64_t>() + y.numel());
    const auto all = acc.gather_for_metrics(labels);
    seen.insert(seen.end(), all.begin(), all.end());
  }
  std::sort(seen.begin(), seen.end());
  std::vector<std::int64_t> expected(n);
  std::iota(expected.begin(), expected.end(), 0);
  const bool ok = names == std::vector<std::string>{"rank 0", "rank 1"} && config.at("lr") == 0.5 && seen == expected;
  if (!ok) std::cerr << "rank " << rank << ": names " << names.size() << " lr " << config.at("lr") << " seen " << seen.size() << std::endl;
  return ok ? 0 : 3;
}

TEST(ObjectCollectives, GatherBroadcastAndGatherForMetricsOfValues) {
  auto job = run_job("object_collectives", {.world_size = 2});
  EXPECT_EQ(job.exit_code, 0) << job.logs();
}

// Ranks whose loaders have different batch sizes are named at prepare(), on both ranks,
// instead of aborting inside Gloo or silently averaging unequal batches later.
ACCELERATE_WORKER(loaders_differ) {
  Acc acc{{.process_group = {.timeout = 60s}}};
  const int rank = acc.process_index();
  const auto batch = static_cast<std::size_t>(4 + 4 * rank);
  try {
    auto [loader] = acc.prepare(accelerate::DataLoader(accelerate::testing::regression_data(64), {.batch_size = batch}));
  } catch (const accelerate::Error& e) {
    std::cerr << e.what() << std::endl;
    return 7;
  }
  return 0;
}

TEST(PrepareChecks, LoadersWithDifferentBatchSizesAreNamedOnEveryRank) {
  auto job = run_job("loaders_differ", {.world_size = 2});
  EXPECT_EQ(job.exit_code, 7) << job.logs();
  for (const int rank : {0, 1}) {
    const auto log = job.log(rank);
    EXPECT_NE(log.find("prepare: dataloader_0 must have the same batch size"), std::string::npos) << log;
    EXPECT_NE(log.find("rank 0"), std::string::npos) << log;
    EXPECT_NE(log.find("rank 1"), std::string::npos) << log;
    EXPECT_NE(log.find("batch_size"), std::string::npos) << log;
  }
}

class GatherForMetrics : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(GatherForMetrics, ReturnsExactlyTheDatasetOnce) {
  const auto [world, n] = GetParam();
  auto job = run_job("gather_for_metrics", {.world_size = world, .args = {std::to_string(n)}});
  ASSERT_EQ(job.exit_code, 0) << job.logs();
  auto gathered = load_tensor(job.dir / "gathered.bin");
  ASSERT_EQ(gathered.numel(), n);
  EXPECT_TRUE(torch::equal(std::get<0>(gathered.sort()), torch::arange(n, torch::kDouble)));
}
// (2 ranks, 10 samples): last round of 4 holds 2 real; (3, 11): last round of 6 holds 5 real.
INSTANTIATE_TEST_SUITE_P(Uneven, GatherForMetrics,
                         ::testing::Values(std::pair{2, 10}, std::pair{3, 11}, std::pair{2, 8}));

ACCELERATE_WORKER(collectives) {
  Acc acc{{.process_group = {.timeout = 60s}}};
  const int rank = acc.process_index(), world = acc.num_processes();
  auto fail = [&](int code, const std::string& what) {
    std::cerr << "rank " << rank << ": " << what << std::endl;
    return code;
  };

  // pad_across_processes: rank r holds r+1 rows of value r.
  auto mine = torch::full({rank + 1, 2}, double(rank));
  auto padded = acc.pad_across_processes(mine, 0, -1.0);
  if (padded.size(0) != world) return fail(2, "pad size");
  if (!torch::equal(padded.narrow(0, 0, rank + 1), mine)) return fail(3, "pad data");
  if (rank + 1 < world && padded[world - 1][0].item<double>() != -1.0) return fail(4, "pad value");
  auto first = acc.pad_across_processes(mine, 0, -1.0, /*pad_first=*/true);
  if (!torch::equal(first.narrow(0, world - rank - 1, rank + 1), mine)) return fail(5, "pad_first");
  // gather of uneven rows concatenates in rank order.
  auto all = acc.gather(mine);
  if (all.size(0) != world * (world + 1) / 2 || all[0][0].item<double>() != 0.0) return fail(6, "gather");

  // broadcast of a nested container: shapes follow the sender.
  std::map<std::string, std::vector<torch::Tensor>> nested;
  if (rank == 0) nested["a"] = {torch::arange(3), torch::ones({2, 2}, torch::kDouble)};
  else nested["a"] = {torch::zeros({1}), torch::zeros({1})};
  auto received = acc.broadcast(nested, 0);
  if (!torch::equal(received["a"][0], torch::arange(3)) ||
      !torch::equal(received["a"][1], torch::ones({2, 2}, torch::kDouble)))
    return fail(7, "broadcast");

  // reduce: sum, mean, max over a tuple.
  auto reduced = acc.reduce(std::tuple{torch::tensor({double(rank)}), torch::tensor({rank + 1})},
                            accelerate::Reduction::sum);
  if (std::get<0>(reduced).item<double>() != world * (world - 1) / 2.0) return fail(8, "sum");
  if (acc.reduce(torch::tensor({double(rank)}), accelerate::Reduction::mean).item<double>() != (world - 1) / 2.0)
    return fail(9, "mean");
  if (acc.reduce(torch::tensor({rank}), accelerate::Reduction::max).item<int64_t>() != world - 1)
    return fail(10, "max");

  // split_between_processes: 5 items on 2 ranks -> 3 + 2 (padded: 3 + 3).
  std::vector<int> items{0, 1, 2, 3, 4};
  auto part = acc.split_between_processes(items);
  auto padded_part = acc.split_between_processes(items, true);
  if (world == 2 && rank == 1 && (part != std::vector<int>{3, 4} || padded_part != std::vector<int>{3, 4, 4}))
    return fail(11, "split");
  auto rows = acc.split_between_processes(torch::arange(5), true);
  if (world == 2 && rows.size(0) != 3) return fail(12, "split tensor");

  // main_process_first: the others enter only after rank 0 left the scope.
  {
    auto scope = acc.main_process_first();
    if (rank == 0) {
      std::this_thread::sleep_for(200ms);
      std::ofstream(job_dir() / "main_done") << "1";
    } else if (!std::filesystem::exists(job_dir() / "main_done")) {
      return fail(13, "main_process_first order");
    }
  }

  // set_seed(device_specific) gives every rank its own stream.
  acc.set_seed(7, /*device_specific=*/true);
  auto draws = acc.gather(torch::randn({1, 4}));
  if (torch::equal(draws[0], draws[1])) return fail(14, "device_specific seed");
  acc.wait_for_everyone();
  const auto stats = acc.stats();
  if (stats.broadcast.calls == 0 || stats.allgather.calls == 0 || stats.barrier.calls == 0)
    return fail(15, "stats");
  return 0;
}

// broadcast_flat (prepare's broadcast of the model): rank 0's values reach every rank, in
// pieces of at most the given bytes per dtype, a contiguous tensor alone without a copy.
TEST(Collectives, WorkOnTensorsAndNestedContainers) {
  for (int world : {2, 3}) {
    auto job = run_job("collectives", {.world_size = world});
    EXPECT_EQ(job.exit_code, 0) << "world " << world << "\n" << job.logs();
  }
}

// Ranks that pass mismatched tensors to a collective: each case is an accelerate::Error on
// every rank naming both ranks and what they passed (never a Gloo abort or a hang), and the
// group still works afterwards.
ACCELERATE_WORKER(mismatched_collectives) {
  Acc acc{{.process_group = {.timeout = 30s}}};
  const int rank = acc.process_index();
  int failures = 0;
  auto expect_error = [&](const std::string& name, auto&& call, std::vector<std::string> expected) {
    std::string message = "no error";
    try {
      call();
    } catch (const accelerate::Error& e) {
      message = e.what();
    }
    expected.push_back("rank 0 passes");
    expected.push_back("rank 1 passes");
    for (const auto& part : expected) {
      if (message.find(part) == std::string::npos) {
        std::cerr << "rank " << rank << ", " << name << ": expected \"" << part << "\" in: " << message << std::endl;
        ++failures;
      }
    }
    // The group is intact: a matching collective right after still works.
    const auto sum = acc.reduce(torch::tensor({1.0}));
    if (sum.item<double>() != acc.num_processes()) {
      std::cerr << "rank " << rank << ", " << name << ": the reduce after it gave " << sum.item<double>() << std::endl;
      ++failures;
    }
  };
  expect_error("gather", [&] { acc.gather(torch::zeros({2, 3 + rank})); },
               {"gather: ranks disagree", "only dim 0 may differ", "Float[2, 3]", "Float[2, 4]"});
  expect_error("reduce shape", [&] { acc.reduce(torch::zeros({3 + rank})); }, {"shapes must be equal", "[3]", "[4]"});
  expect_error("reduce dtype", [&] { acc.reduce(torch::zeros({3}, rank ? torch::kDouble : torch::kFloat)); },
               {"a different dtype", "Double[3]"});
  expect_error("reduction", [&] {
    acc.reduce(torch::zeros({3}), rank ? accelerate::Reduction::max : accelerate::Reduction::sum);
  }, {"a different reduction"});
  expect_error("pad", [&] { acc.pad_across_processes(rank ? torch::zeros({2, 2}) : torch::zeros({2})); },
               {"pad_across_processes", "a different number of dimensions"});
  expect_error("broadcast root", [&] { acc.broadcast(torch::zeros({2}), rank); }, {"a different root"});
  expect_error("different collectives", [&] {
    if (rank == 0) acc.reduce(torch::zeros({2}));
    else acc.gather(torch::zeros({2}));
  }, {"a different collective", "reduce of", "gather of"});
  // Only dim 0 of a gather and the padded dim may differ: these succeed.
  if (acc.gather(torch::zeros({1 + rank, 2})).size(0) != 3) ++failures;
  if (acc.pad_across_processes(torch::zeros({2, 1 + rank}), 1).size(1) != 2) ++failures;
  return failures == 0 ? 0 : 3;
}

TEST(Collectives, MismatchedTensorsAreAnErrorOnEveryRankNamingBoth) {
  auto job = run_job("mismatched_collectives", {.world_size = 2});
  EXPECT_EQ(job.exit_code, 0) << job.logs();
}

// With verify_collectives, a program whose ranks make different collectives — rank 0 in a
// backward (gradient buckets) while rank 1 reduces a metric — fails on both ranks naming both
// collectives, after a few verified steps that train as usual.
ACCELERATE_WORKER(unmatched_collectives_verified) {
  Acc acc{{.process_group = {.timeout = 30s, .verify_collectives = true}}};
  const int rank = acc.process_index();
  accelerate::testing::TinyNet net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, opt] = acc.prepare(net, sgd);
  const auto data = accelerate::testing::regression_data(8);
  for (int i = 0; i < 3; ++i) {
    acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
    opt.step();
    opt.zero_grad();
  }
  if (acc.reduce(torch::tensor({1.0})).item<double>() != 2.0) return 2;
  try {
    if (rank == 0) acc.backward(torch::mse_loss(model(data.inputs()), data.targets()));
    else acc.reduce(torch::tensor({1.0}));
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 7;
  }
  return 0;
}

TEST(VerifyCollectives, RanksInDifferentCollectivesFailNamingBoth) {
  auto job = run_job("unmatched_collectives_verified", {.world_size = 2});
  EXPECT_EQ(job.exit_code, 7) << job.logs();
  for (const int rank : {0, 1}) {
    const auto log = job.log(rank);
    EXPECT_NE(log.find("collective mismatch (ProcessGroupOptions::verify_collectives): rank 0 calls all_reduce of "),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("but rank 1 calls all_gather of 16 Long elements"), std::string::npos) << log;
  }
}

ACCELERATE_WORKER(join_only) {
  Acc acc{{.process_group = {.timeout = 3s}}};
  return 0;
}

// The master port is held by a program that accepts connections and never answers: rank 1
// must give up within its timeout (3 s) plus a small margin, naming the address.
TEST(Rendezvous, ASilentProgramOnTheMasterPortFailsWithinTheTimeout) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 16), 0);  // the kernel completes connections; nobody answers
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  auto job = run_job("join_only", {.world_size = 2, .ranks = {1}, .env = {{"MASTER_PORT", port}}});
  ::close(listener);
  EXPECT_NE(job.exit_code, 0);
  EXPECT_LT(job.seconds, 3.0 + 6.0) << job.logs();
  EXPECT_NE(job.log(1).find("127.0.0.1:" + port), std::string::npos) << job.logs();
}

TEST(Rendezvous, AMissingPeerFailsClearlyWithinTheTimeout) {
  auto job = run_job("join_only", {.world_size = 2, .ranks = {0}});
  EXPECT_NE(job.exit_code, 0);
  EXPECT_LT(job.seconds, 20.0);
  EXPECT_NE(job.log(0).find("rank(s) 1 of 2 never arrived"), std::string::npos) << job.logs();
}

ACCELERATE_WORKER(mismatched_policies) {
  if (std::getenv("RANK") == std::string("1")) {
    accelerate::Accelerator<accelerate::Gloo, accelerate::Bf16> acc{{.process_group = {.timeout = 20s}}};
  } else {
    Acc acc{{.process_group = {.timeout = 20s}}};
  }
  return 0;
}

TEST(Rendezvous, RanksWithDifferentPoliciesAreNamedOnBothSides) {
  auto job = run_job("mismatched_policies", {.world_size = 2, .grace_seconds = 10});
  EXPECT_NE(job.exit_code, 0);
  EXPECT_LT(job.seconds, 15.0);
  EXPECT_NE(job.logs().find("Precision=accelerate::Bf16"), std::string::npos) << job.logs();
  EXPECT_NE(job.logs().find("Precision=accelerate::Fp32"), std::string::npos) << job.logs();
}

ACCELERATE_WORKER(mismatched_reduce_scatter) {
  const bool all_to_all = std::getenv("RANK") != std::string("1");
  Acc acc{{.process_group = {.timeout = 20s, .reduce_scatter_all_to_all = all_to_all}}};
  return 0;
}

TEST(Rendezvous, RanksDisagreeingOnTheReduceScatterAreNamed) {
  auto job = run_job("mismatched_reduce_scatter", {.world_size = 2, .grace_seconds = 10});
  EXPECT_NE(job.exit_code, 0);
  EXPECT_NE(job.logs().find("process_group.reduce_scatter_all_to_all=0"), std::string::npos) << job.logs();
}

ACCELERATE_WORKER(mismatched_sum_order) {
  const bool rank_order = std::getenv("RANK") != std::string("1");
  Acc acc{{.process_group = {.timeout = 20s}, .ddp = {.sum_in_rank_order = rank_order}}};
  return 0;
}

// Ranks summing gradients in different orders would pair an all-to-all with an all-reduce.
TEST(Rendezvous, RanksDisagreeingOnTheGradientSumOrderAreNamed) {
  auto job = run_job("mismatched_sum_order", {.world_size = 3, .grace_seconds = 10});
  EXPECT_NE(job.exit_code, 0);
  EXPECT_NE(job.logs().find("ddp.sum_in_rank_order=0"), std::string::npos) << job.logs();
}

ACCELERATE_WORKER(mismatched_models) {
  Acc acc{{.process_group = {.timeout = 20s}}};
  accelerate::testing::TinyNet net(8, acc.process_index() == 0 ? 16 : 12, 4);
  auto [model] = acc.prepare(net);
  return 0;
}

TEST(Rendezvous, ModelsWithDifferentShapesAreAnError) {
  auto job = run_job("mismatched_models", {.world_size = 2, .grace_seconds = 10});
  EXPECT_NE(job.exit_code, 0);
  EXPECT_NE(job.logs().find("fc1.weight:Float[12,8] (rank 0: fc1.weight:Float[16,8])"), std::string::npos)
      << job.logs();
}

}  // namespace
