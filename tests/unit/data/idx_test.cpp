// Tests of include/accelerate/data/idx.hpp: the gzip'd IDX reader of Fashion-MNIST.
#include <accelerate/data/idx.hpp>

#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>
#include <vector>

#include "../../support/temp_dir.hpp"

namespace {

void write_gz(const std::filesystem::path& path, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

TEST(Idx, ReadsImagesAndReportsTruncation) {
  accelerate::testing::TempDir dir;
  std::vector<unsigned char> idx{0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3};
  for (int i = 0; i < 12; ++i) idx.push_back(static_cast<unsigned char>(i));
  write_gz(dir / "ok.gz", idx);
  auto t = accelerate::data::read_idx(dir / "ok.gz");
  EXPECT_EQ(t.sizes(), torch::IntArrayRef({2, 2, 3}));
  EXPECT_EQ(t[1][1][2].item<int>(), 11);

  idx.resize(idx.size() - 3);
  write_gz(dir / "short.gz", idx);
  try {
    accelerate::data::read_idx(dir / "short.gz");
    FAIL();
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("short.gz: truncated while reading the data"), std::string::npos) << e.what();
  }
}

TEST(Idx, MissingFashionMnistNamesTheDebianPackage) {
  try {
    accelerate::data::load_fashion_mnist("/nonexistent", true);
    FAIL();
  } catch (const accelerate::Error& e) {
    EXPECT_NE(std::string(e.what()).find("dataset-fashion-mnist"), std::string::npos) << e.what();
  }
}

}  // namespace
