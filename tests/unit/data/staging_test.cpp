// DeviceStager's ring of reused host buffers, against a device whose copies run only when
// something waits for them (as an accelerator's asynchronous copies may run late): a buffer
// rewritten before the copies reading it are fenced shows up as a wrong batch. The CUDA
// transfer itself is tested in gpu/gpu_test.cpp.
#include <accelerate/data/staging.hpp>

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace {

using accelerate::data::DeviceStager;

/// The device's side: copies queued in issue order, run when a fence is waited on by the host.
struct LateDevice {
  std::vector<std::pair<at::Tensor, at::Tensor>> queue;  // (host source, device result)
  std::size_t done = 0;
  std::vector<std::size_t> marks;  // per fence: queue length when it was last recorded
  std::vector<std::string> log;
  int copies_until_failure = -1;   // a copy fails when this reaches 0

  void run_to(std::size_t n) {
    for (; done < n; ++done) queue[done].second.copy_(queue[done].first);
  }
  void synchronize() { run_to(queue.size()); }
};

struct LateTransfer {
  using Fence = int;
  std::shared_ptr<LateDevice> late = std::make_shared<LateDevice>();

  c10::Device device() const { return c10::Device(c10::kMeta); }
  Fence make_fence() {
    late->marks.push_back(0);
    return static_cast<int>(late->marks.size()) - 1;
  }
  at::Tensor host_buffer(std::int64_t bytes) {
    late->log.push_back("allocate " + std::to_string(bytes));
    return at::empty({bytes}, at::kByte);
  }
  at::Tensor copy(const at::Tensor& host) {
    if (late->copies_until_failure >= 0 && late->copies_until_failure-- == 0) throw std::runtime_error("copy failed");
    late->log.push_back("copy");
    auto out = at::full_like(host, 7);  // what a late copy would leave: not the batch
    late->queue.emplace_back(host, out);
    return out;
  }
  void record(Fence& fence) {
    late->log.push_back("record " + std::to_string(fence));
    late->marks[fence] = late->queue.size();
  }
  void wait_on_device(Fence& fence) { late->log.push_back("device waits " + std::to_string(fence)); }
  void wait_on_host(Fence& fence) {
    late->log.push_back("host waits " + std::to_string(fence));
    late->run_to(late->marks[fence]);
  }
};
static_assert(accelerate::data::StagingTransfer<LateTransfer>);
static_assert(accelerate::data::StagingTransfer<accelerate::data::StreamTransfer>);

using Batch = std::tuple<at::Tensor, std::vector<at::Tensor>>;

Batch make_batch(int k, std::int64_t rows = 4) {
  const auto base = static_cast<double>(100 * k);
  auto x = at::arange(rows * 3, at::kFloat).reshape({rows, 3}) + base;
  auto columns = (at::arange(rows * 2, at::kLong).reshape({2, rows}) + 100 * k).t();  // not contiguous
  auto scalar = at::scalar_tensor(base + 0.5, at::kDouble);
  auto mask = at::arange(rows, at::kLong).remainder(k + 2).eq(0);
  return {x, {columns, scalar, mask, at::empty({0, 3})}};
}

void expect_equal(const Batch& staged, const Batch& source, int k) {
  const auto& [x, rest] = staged;
  const auto& [sx, srest] = source;
  EXPECT_TRUE(at::equal(x, sx)) << "batch " << k;
  ASSERT_EQ(rest.size(), srest.size());
  for (std::size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].scalar_type(), srest[i].scalar_type()) << "batch " << k << " tensor " << i;
    EXPECT_EQ(rest[i].sizes(), srest[i].sizes()) << "batch " << k << " tensor " << i;
    if (rest[i].numel() > 0) {
      EXPECT_TRUE(at::equal(rest[i], srest[i])) << "batch " << k << " tensor " << i;
    }
  }
}

TEST(DeviceStager, BatchesArriveIntactWhenCopiesRunLate) {
  LateTransfer transfer;
  auto late = transfer.late;
  DeviceStager<LateTransfer> stager(transfer, /*slots=*/2);
  std::vector<Batch> sources, staged;
  for (int k = 0; k < 7; ++k) {
    sources.push_back(make_batch(k));
    staged.push_back(stager.stage(sources.back()));
  }
  late->synchronize();
  for (int k = 0; k < 7; ++k) expect_equal(staged[k], sources[k], k);
  // The empty tensor is made on the device directly; the staged tensors are new tensors.
  EXPECT_EQ(std::get<1>(staged[0])[3].device(), c10::Device(c10::kMeta));
  EXPECT_FALSE(std::get<0>(staged[0]).is_same(std::get<0>(sources[0])));
}

TEST(DeviceStager, ReusesItsBuffersAndAllocatesOnlyToGrow) {
  LateTransfer transfer;
  DeviceStager<LateTransfer> stager(transfer, /*slots=*/2);
  for (int k = 0; k < 10; ++k) stager.stage(make_batch(k));
  // Four non-empty tensors per batch, two slots.
  EXPECT_EQ(stager.host_allocations(), 8u);
  const auto bytes = stager.host_bytes();
  EXPECT_EQ(bytes, 2 * (4 * 3 * 4 + 4 * 2 * 8 + 8 + 4));
  stager.stage(make_batch(10, /*rows=*/3));  // a shorter last batch fits the buffers it has
  EXPECT_EQ(stager.host_allocations(), 8u);
  EXPECT_EQ(stager.host_bytes(), bytes);
  stager.stage(make_batch(11, /*rows=*/6));  // a longer one grows its slot's buffers only
  EXPECT_EQ(stager.host_allocations(), 11u);  // the scalar's buffer is big enough already
  EXPECT_GT(stager.host_bytes(), bytes);
}

TEST(DeviceStager, FencesEachBatchAfterItsCopiesAndWaitsBeforeReusingASlot) {
  LateTransfer transfer;
  auto late = transfer.late;
  DeviceStager<LateTransfer> stager(transfer, /*slots=*/2);
  for (int k = 0; k < 3; ++k) stager.stage(at::full({2}, static_cast<float>(k)));
  const std::vector<std::string> expected{
      "allocate 8", "copy", "record 0", "device waits 0",        // batch 0, slot 0
      "allocate 8", "copy", "record 1", "device waits 1",        // batch 1, slot 1
      "host waits 0", "copy", "record 0", "device waits 0"};     // batch 2 reuses slot 0
  EXPECT_EQ(late->log, expected);
}

TEST(DeviceStager, AFailedCopyStillFencesTheSlotItUsed) {
  LateTransfer transfer;
  auto late = transfer.late;
  DeviceStager<LateTransfer> stager(transfer, /*slots=*/2);
  late->copies_until_failure = 1;  // the batch's second tensor fails
  EXPECT_THROW(stager.stage(std::vector<at::Tensor>{at::ones({2}), at::ones({3})}), std::runtime_error);
  late->log.clear();
  stager.stage(at::ones({2}));
  const auto again = stager.stage(at::full({2}, 5.0f));  // slot 0 again: its earlier copy is fenced
  ASSERT_GE(late->log.size(), 5u);
  EXPECT_EQ(late->log[4], "host waits 0");
  EXPECT_EQ(late->done, 1u);  // the failed batch's first copy ran before slot 0 was rewritten
  late->synchronize();
  EXPECT_TRUE(at::equal(again, at::full({2}, 5.0f)));
}

TEST(DeviceStager, TensorsAlreadyOnTheDeviceAndUndefinedOnesPassThrough) {
  LateTransfer transfer;
  DeviceStager<LateTransfer> stager(transfer);
  const auto on_device = at::empty({3}, at::TensorOptions().device(c10::kMeta));
  const auto staged = stager.stage(std::vector<at::Tensor>{on_device, at::Tensor()});
  EXPECT_TRUE(staged[0].is_same(on_device));
  EXPECT_FALSE(staged[1].defined());
  EXPECT_EQ(stager.host_allocations(), 0u);
  EXPECT_THROW(DeviceStager<LateTransfer>(LateTransfer{}, 0), accelerate::Error);
}

}  // namespace
