// Interoperability: models saved here load in Python with safetensors and Accelerate, and
// models saved by Python Accelerate load here (tests/checkpoint/interop.py does the Python
// side with the .venv's packages).
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <cstdlib>

#include "../support/build_paths.hpp"
#include "../support/models.hpp"
#include "../support/temp_dir.hpp"

namespace {

namespace ckpt = accelerate::checkpoint;
using accelerate::testing::Wide;


int python(const std::string& args) {
  const std::string command = std::string(ACCELERATE_TEST_PYTHON) + " " + ACCELERATE_INTEROP_SCRIPT + " " + args;
  return std::system(command.c_str());
}

bool have_python() { return std::filesystem::exists(ACCELERATE_TEST_PYTHON); }

TEST(Interop, PythonLoadsOurModelsSingleAndSharded) {
  if (!have_python()) GTEST_SKIP() << "no Python environment at " << ACCELERATE_TEST_PYTHON << " (scripts/quickstart.sh makes it)";
  accelerate::testing::TempDir dir;
  accelerate::Accelerator<> acc{{.cpu = true, .seed = 3}};
  Wide net;
  {
    torch::NoGradGuard no_grad;
    net->norm->running_mean.uniform_(-1, 1);
    net->norm->running_var.uniform_(0.5, 2);
    net->norm->num_batches_tracked.fill_(17);
  }
  auto [model] = acc.prepare(net);
  model->eval();
  acc.save_model(model, dir / "single");
  acc.save_model(model, dir / "sharded", {.max_shard_size = std::string("2KB")});
  ASSERT_TRUE(std::filesystem::exists(dir / "sharded" / "model.safetensors.index.json"));
  const auto x = torch::randn({4, 64});
  ckpt::save_safetensors(dir / "io.safetensors", {{"input", x}, {"output", model(x)}});
  EXPECT_EQ(python("read " + (dir / "single").string() + " " + (dir / "sharded").string() + " " +
                   (dir / "io.safetensors").string()),
            0);
}

TEST(Interop, WeLoadModelsSavedByPythonAccelerate) {
  if (!have_python()) GTEST_SKIP() << "no Python environment at " << ACCELERATE_TEST_PYTHON;
  accelerate::testing::TempDir dir;
  for (const std::string shard : {"10GB", "2KB"}) {
    const auto out = dir / ("python_" + shard);
    ASSERT_EQ(python("write " + out.string() + " " + (dir / "io.safetensors").string() + " " + shard), 0);
    Wide net;
    net->eval();
    accelerate::load_checkpoint_in_model(*net, out);
    auto io = ckpt::SafetensorsFile::open(dir / "io.safetensors");
    EXPECT_TRUE(torch::equal(net(io.tensor("input")), io.tensor("output"))) << shard;
  }
}

}  // namespace
