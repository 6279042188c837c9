// Tests of include/accelerate/track/: JSONL and CSV trackers, a user-defined Tracker, the
// TensorBoard event-file writer read back by the real TensorBoard reader, and the progress bar.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <fstream>

#include "../../support/build_paths.hpp"
#include "../../support/temp_dir.hpp"

namespace {

using accelerate::testing::TempDir;

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

struct Recording {
  std::vector<std::pair<std::int64_t, accelerate::Metrics>>* seen;
  std::string name() const { return "recording"; }
  void start(const std::string&, const nlohmann::json&) {}
  void log(const accelerate::Metrics& values, std::int64_t step) { seen->emplace_back(step, values); }
  void finish() {}
};
static_assert(accelerate::Tracker<Recording>);

TEST(Trackers, JsonlCsvAndUserTrackersRecordEveryLog) {
  TempDir dir;
  std::vector<std::pair<std::int64_t, accelerate::Metrics>> seen;
  accelerate::Accelerator<> acc{{.cpu = true, .tracking = {.log_with = {"jsonl", "csv"}, .logging_dir = dir.path()}}};
  acc.add_tracker(Recording{&seen});
  acc.init_trackers("run", {{"lr", 0.5}});
  acc.log({{"loss", 1.5}, {"a,b", 2.0}}, 10);
  acc.log({{"loss", 0.25}}, 20);
  acc.end_training();
  EXPECT_EQ(read_file(dir / "run" / "metrics.jsonl"),
            "{\"a,b\":2.0,\"loss\":1.5,\"step\":10}\n{\"loss\":0.25,\"step\":20}\n");
  EXPECT_EQ(read_file(dir / "run" / "metrics.csv"), "step,name,value\n10,\"a,b\",2\n10,loss,1.5\n20,loss,0.25\n");
  EXPECT_EQ(nlohmann::json::parse(read_file(dir / "run" / "config.json"))["lr"], 0.5);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].first, 20);
}

TEST(Trackers, TheSetFallsBackToTheProjectFolderAndForgetsItsTrackersWhenFinished) {
  TempDir dir;
  std::vector<std::pair<std::int64_t, accelerate::Metrics>> seen;
  accelerate::Trackers trackers;
  trackers.add(Recording{&seen});
  trackers.start("run", {{"lr", 0.5}}, {.log_with = {"all"}}, dir.path());  // no logging_dir
  EXPECT_EQ(trackers.size(), 4u) << "jsonl, csv, tensorboard and the user's";
  trackers.log({{"loss", 1.0}}, 3);
  trackers.finish();
  EXPECT_EQ(trackers.size(), 0u);
  EXPECT_EQ(read_file(dir / "run" / "metrics.jsonl"), "{\"loss\":1.0,\"step\":3}\n");
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].first, 3);
}

TEST(Trackers, UnknownBuiltInTrackerNamesTheValidOnes) {
  try {
    accelerate::Accelerator<> acc{{.cpu = true, .tracking = {.log_with = {"wandb"}}}};
    FAIL();
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown tracker 'wandb'; valid: jsonl, csv, tensorboard, all"), std::string::npos);
  }
}

TEST(TensorBoard, Crc32cMatchesTheStandardCheckValue) {
  EXPECT_EQ(accelerate::detail::crc32c("123456789", 9), 0xE3069283u);
}

TEST(TensorBoard, TheRealTensorBoardReaderReadsOurEventFiles) {
  if (!std::filesystem::exists(ACCELERATE_TEST_PYTHON)) GTEST_SKIP() << "no Python environment";
  TempDir dir;
  accelerate::TensorBoardTracker tb(dir.path());
  tb.start("run", {});
  for (int step = 0; step < 5; ++step) tb.log({{"loss", 1.0 / (step + 1)}, {"lr", 0.1 * step}}, step * 10);
  tb.finish();
  const std::string script =
      "import sys\n"
      "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
      "ea = EventAccumulator(sys.argv[1]); ea.Reload()\n"
      "for tag in sorted(ea.Tags()['scalars']):\n"
      "    print(tag, ' '.join(f'{e.step}:{e.value:.6f}' for e in ea.Scalars(tag)))\n";
  std::ofstream(dir / "read.py") << script;
  const std::string command = std::string(ACCELERATE_TEST_PYTHON) + " " + (dir / "read.py").string() + " " +
                              (dir / "run").string() + " > " + (dir / "out.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << read_file(dir / "out.txt");
  EXPECT_EQ(read_file(dir / "out.txt"),
            "loss 0:1.000000 10:0.500000 20:0.333333 30:0.250000 40:0.200000\n"
            "lr 0:0.000000 10:0.100000 20:0.200000 30:0.300000 40:0.400000\n");
}

TEST(Progress, PlainLinesWithoutATerminalAndNothingWhenDisabled) {
  std::ostringstream captured;
  auto* old = std::cout.rdbuf(captured.rdbuf());
  {
    accelerate::ProgressBar bar(5, {.interactive = false, .plain_every = 2, .description = "epoch 1"});
    for (int i = 0; i < 5; ++i) bar.update(0.5);
  }
  {
    accelerate::ProgressBar off(5, {.enabled = false});
    off.update();
  }
  std::cout.rdbuf(old);
  const auto text = captured.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3) << text;  // at 2, 4 and the close at 5
  EXPECT_NE(text.find("epoch 1 2/5"), std::string::npos) << text;
  EXPECT_NE(text.find("epoch 1 5/5"), std::string::npos) << text;
  EXPECT_NE(text.find("loss 0.5000"), std::string::npos) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos);
}

}  // namespace
