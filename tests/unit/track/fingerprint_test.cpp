// Tests of include/accelerate/track/fingerprint.hpp: fingerprints tell tensors apart by their
// bits, survive a JSONL tracker, and first_difference finds a planted one-ulp change in the
// step and tensor where it was planted.
#include <accelerate/accelerate.hpp>
#include <accelerate/track/fingerprint.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("accelerate_fingerprint_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// `tensor` with element `index` moved to the next representable float upwards.
at::Tensor one_ulp_up(const at::Tensor& tensor, int64_t index) {
  at::Tensor changed = tensor.detach().clone();
  float* values = changed.data_ptr<float>();
  values[index] = std::nextafter(values[index], std::numeric_limits<float>::infinity());
  return changed;
}

TEST(Fingerprint, TellsTensorsApartByTheirBits) {
  torch::manual_seed(0);
  const at::Tensor a = torch::randn({64, 33});
  EXPECT_EQ(accelerate::fingerprint(a), accelerate::fingerprint(a.clone()));
  for (const int64_t index : {0, 1, 1000, 64 * 33 - 1})  // first, odd (upper half of a word), middle, tail
    EXPECT_NE(accelerate::fingerprint(a), accelerate::fingerprint(one_ulp_up(a, index))) << "element " << index;
  EXPECT_NE(accelerate::fingerprint(a), accelerate::fingerprint(a.reshape({33, 64})));        // shape
  EXPECT_NE(accelerate::fingerprint(a), accelerate::fingerprint(a.to(torch::kDouble)));       // dtype
  EXPECT_NE(accelerate::fingerprint(torch::zeros({1})), accelerate::fingerprint(-torch::zeros({1})));  // -0
  // The values in row-major order, however they are laid out.
  const at::Tensor transposed = a.t();
  EXPECT_EQ(accelerate::fingerprint(transposed), accelerate::fingerprint(transposed.contiguous()));
  EXPECT_NE(accelerate::fingerprint(transposed), accelerate::fingerprint(a));
}

TEST(Fingerprint, MetricsAreExactIntegersThatAJsonlRecordKeeps) {
  const std::map<std::string, at::Tensor> tensors = {{"w", torch::randn({5, 5})}, {"b", torch::arange(3)}};
  const accelerate::Metrics metrics = accelerate::fingerprint_metrics(tensors);
  ASSERT_EQ(metrics.size(), 2u);
  for (const auto& [name, value] : metrics) {
    EXPECT_TRUE(name == "fingerprint/w" || name == "fingerprint/b") << name;
    EXPECT_EQ(value, std::floor(value));
    EXPECT_LT(value, std::ldexp(1.0, 52));
  }
  const fs::path dir = fresh_dir("jsonl");
  accelerate::JsonlTracker tracker(dir);
  tracker.start("run", nlohmann::json::object());
  tracker.log(metrics, 7);
  tracker.finish();
  std::ifstream in(dir / "run" / "metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const auto record = nlohmann::json::parse(line);
  EXPECT_EQ(record.at("fingerprint/w").get<double>(), metrics.at("fingerprint/w"));
  EXPECT_EQ(record.at("fingerprint/b").get<double>(), metrics.at("fingerprint/b"));
  fs::remove_all(dir);
}

// Six SGD steps of a small model, fingerprints logged each step to <dir>/<name>/metrics.jsonl;
// with `plant_at`, the first Linear's weight is moved one ulp at that step (after its update).
void train_and_record(const fs::path& dir, const std::string& name, std::optional<int> plant_at = std::nullopt) {
  torch::manual_seed(1);
  torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 1));
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  accelerate::JsonlTracker tracker(dir);
  tracker.start(name, nlohmann::json::object());
  const at::Tensor x = torch::randn({16, 4}), y = torch::randn({16, 1});
  for (int step = 0; step < 6; ++step) {
    sgd.zero_grad();
    torch::mse_loss(net->forward(x), y).backward();
    sgd.step();
    if (plant_at == step) {
      torch::NoGradGuard no_grad;
      at::Tensor weight = net->named_parameters()["0.weight"];
      weight.copy_(one_ulp_up(weight, 5));
    }
    std::map<std::string, at::Tensor> state;
    for (const auto& item : net->named_parameters()) state[item.key()] = item.value();
    tracker.log(accelerate::fingerprint_metrics(state), step);
    tracker.log({{"loss", 0.5}}, step);  // other metrics, in their own records, are not compared
  }
  tracker.finish();
}

TEST(Fingerprint, FirstDifferenceNamesThePlantedStepAndTensor) {
  const fs::path dir = fresh_dir("runs");
  train_and_record(dir, "a");
  train_and_record(dir, "b");
  train_and_record(dir, "planted", 3);
  EXPECT_FALSE(accelerate::first_difference(dir / "a" / "metrics.jsonl", dir / "b" / "metrics.jsonl"));
  const auto difference = accelerate::first_difference(dir / "a" / "metrics.jsonl", dir / "planted" / "metrics.jsonl");
  ASSERT_TRUE(difference.has_value());
  EXPECT_EQ(difference->step, 3);
  // Only the planted tensor at that step: the next steps carry it on to the others.
  EXPECT_EQ(difference->tensors, std::vector<std::string>{"0.weight"});
  fs::remove_all(dir);
}

TEST(Fingerprint, FirstDifferenceComparesTheStepsBothRunsRecordedAndRefusesWhatIsNotARecord) {
  const fs::path dir = fresh_dir("files");
  std::ofstream(dir / "short.jsonl") << R"({"step": 0, "fingerprint/w": 1})" << '\n';
  std::ofstream(dir / "long.jsonl") << R"({"step": 0, "fingerprint/w": 1})" << '\n'
                                    << R"({"step": 1, "fingerprint/w": 2})" << '\n';
  std::ofstream(dir / "extra.jsonl") << R"({"step": 0, "fingerprint/w": 1, "fingerprint/v": 3})" << '\n';
  std::ofstream(dir / "bad.jsonl") << R"({"step": 0, "fingerprint/w": 1})" << '\n' << "not json\n";
  std::ofstream(dir / "no_step.jsonl") << R"({"fingerprint/w": 1})" << '\n';
  EXPECT_FALSE(accelerate::first_difference(dir / "short.jsonl", dir / "long.jsonl"));
  const auto extra = accelerate::first_difference(dir / "short.jsonl", dir / "extra.jsonl");
  ASSERT_TRUE(extra.has_value());
  EXPECT_EQ(extra->tensors, std::vector<std::string>{"v"});  // recorded by one run only
  auto message = [&](const char* a, const char* b) {
    try {
      accelerate::first_difference(dir / a, dir / b);
    } catch (const accelerate::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string bad = message("short.jsonl", "bad.jsonl");
  EXPECT_NE(bad.find("bad.jsonl line 2"), std::string::npos) << bad;
  const std::string no_step = message("no_step.jsonl", "short.jsonl");
  EXPECT_NE(no_step.find("no_step.jsonl line 1 has no integer \"step\""), std::string::npos) << no_step;
  const std::string missing = message("short.jsonl", "absent.jsonl");
  EXPECT_NE(missing.find("cannot read"), std::string::npos) << missing;
  fs::remove_all(dir);
}

}  // namespace
