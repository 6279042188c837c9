// Tests of checkpoint/safetensors.hpp and checkpoint/sharding.hpp: every dtype round-trips,
// shards and their index follow Hugging Face's layout, and broken or hostile files are
// rejected with an error naming the file and the problem.
#include <accelerate/accelerate.hpp>

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "../support/models.hpp"
#include "../support/errors.hpp"
#include "../support/temp_dir.hpp"

namespace {

namespace ckpt = accelerate::checkpoint;
using accelerate::testing::TempDir;
using accelerate::testing::TinyNet;
using accelerate::testing::Wide;

using accelerate::testing::error_of;

TEST(Safetensors, EveryDtypeRoundTrips) {
  TempDir dir;
  std::map<std::string, torch::Tensor> tensors{
      {"f64", torch::randn({2, 3}, torch::kDouble)},
      {"f32", torch::randn({4})},
      {"f16", torch::randn({3, 1}).to(torch::kHalf)},
      {"bf16", torch::randn({5}).to(torch::kBFloat16)},
      {"i64", torch::arange(7)},
      {"i32", torch::arange(3, torch::kInt)},
      {"i16", torch::arange(3, torch::kShort)},
      {"i8", torch::tensor({-1, 2}, torch::kChar)},
      {"u8", torch::tensor({0, 255}, torch::kByte)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(int64_t{42})},       // 0-d, like num_batches_tracked
      {"empty", torch::empty({0, 3})},
      {"strided", torch::randn({4, 4}).t()},         // non-contiguous input
  };
  ckpt::save_safetensors(dir / "all.safetensors", tensors, {{"format", "pt"}});
  auto file = ckpt::SafetensorsFile::open(dir / "all.safetensors");
  EXPECT_EQ(file.metadata().at("format"), "pt");
  ASSERT_EQ(file.names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const auto back = file.tensor(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(back.sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(back, t)) << name;
  }
  // The header is padded to 8 bytes and tensors are laid out by decreasing element size, so
  // every tensor is aligned for its dtype within the mapping.
  for (const auto& [name, entry] : file.entries()) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(file.tensor(name).data_ptr()) % c10::elementSize(entry.dtype), 0u)
        << name;
  }
}

TEST(Safetensors, SizesParseLikeAccelerate) {
  EXPECT_EQ(ckpt::parse_size("1GB"), 1'000'000'000u);
  EXPECT_EQ(ckpt::parse_size("500MB"), 500'000'000u);
  EXPECT_EQ(ckpt::parse_size("2.5kb"), 2500u);
  EXPECT_EQ(ckpt::parse_size("1GiB"), 1073741824u);
  EXPECT_EQ(ckpt::parse_size("123"), 123u);
  EXPECT_NE(error_of([] { ckpt::parse_size("1 GBs"); }).find("unknown unit 'GBs'"), std::string::npos);
  EXPECT_NE(error_of([] { ckpt::parse_size("lots"); }).find("'lots' is not a size"), std::string::npos);
  // Spaces around the number and the unit, as Accelerate's strings allow.
  EXPECT_EQ(ckpt::parse_size(" 1.5 GB "), 1'500'000'000u);
  EXPECT_EQ(ckpt::parse_size("7 b"), 7u);
  EXPECT_EQ(ckpt::parse_size("10\tMiB"), 10u * 1048576u);
  for (const char* malformed : {"1.", ".5GB", "1e3", "1 2MB", "-1GB", "1,5GB", "GB", "", "1GB!"})
    EXPECT_NE(error_of([&] { ckpt::parse_size(malformed); }).find("is not a size"), std::string::npos) << malformed;
  EXPECT_NE(error_of([] { ckpt::parse_size("0"); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([] { ckpt::parse_size("20000000TB"); }).find("out of range"), std::string::npos);
}

TEST(SaveModel, ItsFileNamesAreRecognisedAndNoOthers) {
  for (const char* name : {"model.safetensors", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
                           "model-12345-of-99999.safetensors"})
    EXPECT_TRUE(ckpt::is_model_file(name)) << name;
  for (const char* name : {"model-0001-of-00002.safetensors", "model-00001-of-00002.safetensors.tmp",
                           "model-0000a-of-00002.safetensors", "xmodel-00001-of-00002.safetensors",
                           "model-00001_of-00002.safetensors", "optimizer.safetensors", "model.bin", ""})
    EXPECT_FALSE(ckpt::is_model_file(name)) << name;
}


TEST(SaveModel, ATensorLargerThanTheCapGetsAShardOfItsOwn) {
  TempDir dir;
  Wide net;
  const auto written = ckpt::write_model_files(*net, dir.path(), {.max_shard_size = std::uint64_t{1000}});
  // big.weight (16384 B) alone; the rest in order, each shard closing before it would pass 1000 B.
  std::ifstream in(dir / "model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  const auto& map = index["weight_map"];
  const std::string first = map["big.weight"];
  for (const auto& [name, file] : map.items()) {
    if (name != "big.weight") {
      EXPECT_NE(file.get<std::string>(), first) << name;
    }
  }
  std::uint64_t total = 0;
  for (const auto& [name, t] : accelerate::checkpoint::named_tensors(*net)) total += t.numel() * t.element_size();
  EXPECT_EQ(index["metadata"]["total_size"].get<std::uint64_t>(), total);
  EXPECT_TRUE(map.contains("norm.num_batches_tracked"));  // buffers too
  const auto count = written.size() - 1;  // minus the index
  EXPECT_EQ(std::filesystem::path(written.front()).filename(), ckpt::shard_file_name(0, count));
  EXPECT_EQ(ckpt::shard_file_name(1, 3), "model-00002-of-00003.safetensors");
  // The index is sorted, indented by 2 and ends with a newline, as huggingface_hub writes it.
  std::ifstream raw(dir / "model.safetensors.index.json");
  std::string text((std::istreambuf_iterator<char>(raw)), {});
  EXPECT_EQ(text, index.dump(2) + "\n");

  // Saving again unsharded removes the shards and the index.
  ckpt::write_model_files(*net, dir.path());
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& f : std::filesystem::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 1u);
  EXPECT_TRUE(std::filesystem::exists(dir / "model.safetensors"));
}

// Python Accelerate's save_model(max_shard_size=100) on this model puts the BatchNorm buffers
// in shard 2 and the second Linear in shard 3: PyTorch's state_dict order, module by module.
TEST(SaveModel, ShardsFollowPyTorchsStateDictOrder) {
  TempDir dir;
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4), torch::nn::Linear(4, 5));
  const auto names = ckpt::named_tensors(*net);
  std::vector<std::string> keys;
  for (const auto& [name, t] : names) keys.push_back(name);
  EXPECT_EQ(keys, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                            "1.running_var", "1.num_batches_tracked", "2.weight", "2.bias"}));
  ckpt::write_model_files(*net, dir.path(), {.max_shard_size = std::uint64_t{100}});
  const auto index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  const auto& map = index.at("weight_map");
  EXPECT_EQ(map.at("1.bias"), "model-00001-of-00003.safetensors");
  EXPECT_EQ(map.at("1.running_mean"), "model-00002-of-00003.safetensors");
  EXPECT_EQ(map.at("1.num_batches_tracked"), "model-00002-of-00003.safetensors");
  EXPECT_EQ(map.at("2.weight"), "model-00003-of-00003.safetensors");
  EXPECT_EQ(map.at("2.bias"), "model-00003-of-00003.safetensors");
}

TEST(SaveModel, LoadsBackFromAFileAFolderOrAnIndex) {
  TempDir dir;
  Wide source;
  ckpt::write_model_files(*source, dir / "single");
  ckpt::write_model_files(*source, dir / "sharded", {.max_shard_size = std::string("2KB")});
  const auto x = torch::randn({4, 64});
  source->eval();
  const auto expected = source(x);
  for (const auto& path : {dir / "single", dir / "single" / "model.safetensors", dir / "sharded",
                           dir / "sharded" / "model.safetensors.index.json"}) {
    Wide target;
    target->eval();
    accelerate::load_checkpoint_in_model(*target, path);
    EXPECT_TRUE(torch::equal(target(x), expected)) << path;
  }
}

TEST(SaveModel, StrictLoadingListsEveryProblem) {
  TempDir dir;
  TinyNet small(8, 16, 4);
  ckpt::write_model_files(*small, dir.path());
  Wide other;
  const auto message = error_of([&] { accelerate::load_checkpoint_in_model(*other, dir.path()); });
  EXPECT_NE(message.find("missing keys (11): big.bias big.weight"), std::string::npos) << message;
  EXPECT_NE(message.find("unexpected keys (4): fc1.bias fc1.weight fc2.bias fc2.weight"), std::string::npos) << message;
  TinyNet wider(8, 32, 4);
  const auto mismatch = error_of([&] { accelerate::load_checkpoint_in_model(*wider, dir.path()); });
  EXPECT_NE(mismatch.find("fc1.weight (module Float[32, 8], file Float[16, 8])"), std::string::npos) << mismatch;
  // Non-strict loads what matches and reports the rest.
  struct Bigger : accelerate::testing::TinyNetImpl {
    Bigger() { extra = register_parameter("extra", torch::zeros({2})); }
    torch::Tensor extra;
  };
  Bigger bigger;
  const auto report = accelerate::load_checkpoint_in_model(bigger, dir.path(), std::nullopt, /*strict=*/false);
  EXPECT_EQ(report.missing_keys, std::vector<std::string>{"extra"});
  EXPECT_TRUE(torch::equal(bigger.fc1->weight, small->fc1->weight));
}

TEST(SaveModel, AnIndexNamingAMissingShardIsAnError) {
  TempDir dir;
  Wide net;
  ckpt::write_model_files(*net, dir.path(), {.max_shard_size = std::string("2KB")});
  std::size_t shards = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir.path())) shards += f.path().extension() == ".safetensors";
  ASSERT_GT(shards, 1u);
  std::filesystem::remove(dir / ckpt::shard_file_name(1, shards));
  const auto message = error_of([&] { accelerate::load_checkpoint_in_model(*net, dir.path()); });
  EXPECT_NE(message.find("names shard model-00002-of-"), std::string::npos) << message;
  EXPECT_NE(message.find("does not exist"), std::string::npos) << message;
}

TEST(SaveModel, ShardsOfDifferentSavesAreRefusedTogether) {
  TempDir dir;
  Wide first, second;
  ckpt::write_model_files(*first, dir / "a", {.max_shard_size = std::string("2KB")});
  ckpt::write_model_files(*second, dir / "b", {.max_shard_size = std::string("2KB")});
  std::size_t shards = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir / "a")) shards += f.path().extension() == ".safetensors";
  ASSERT_GT(shards, 1u);
  // Same names, same shapes: only the save id tells them apart.
  std::filesystem::copy_file(dir / "b" / ckpt::shard_file_name(1, shards), dir / "a" / ckpt::shard_file_name(1, shards),
                             std::filesystem::copy_options::overwrite_existing);
  Wide target;
  const auto message = error_of([&] { accelerate::load_checkpoint_in_model(*target, dir / "a"); });
  EXPECT_NE(message.find("mixes shards of different saves"), std::string::npos) << message;
}

TEST(SaveModel, ReplacingAModelKeepsTheFoldersOtherFilesAndDropsStaleShards) {
  TempDir dir;
  Wide net;
  const auto folder = dir / "model";
  ckpt::write_model_files(*net, folder, {.max_shard_size = std::string("2KB")});
  std::ofstream(folder / "config.json") << "{}";
  std::filesystem::create_directories(folder / "tokenizer");
  std::ofstream(folder / "tokenizer" / "vocab.txt") << "a b c";
  ckpt::write_model_files(*net, folder);  // one file now
  std::set<std::string> names;
  for (const auto& f : std::filesystem::directory_iterator(folder)) names.insert(f.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"config.json", "model.safetensors", "tokenizer"}));
  EXPECT_TRUE(std::filesystem::exists(folder / "tokenizer" / "vocab.txt"));
  std::size_t siblings = 0;
  for ([[maybe_unused]] const auto& f : std::filesystem::directory_iterator(dir.path())) ++siblings;
  EXPECT_EQ(siblings, 1u) << "no staging folder left behind";
}

TEST(SaveModel, PickleIsRefused) {
  TempDir dir;
  TinyNet net;
  EXPECT_NE(error_of([&] { ckpt::write_model_files(*net, dir.path(), {.safe_serialization = false}); })
                .find("never writes"),
            std::string::npos);
}

// Writes a file with header `header` followed by `data_bytes` zero bytes.
void write_raw(const std::filesystem::path& path, const std::string& header, std::size_t data_bytes,
               std::optional<std::uint64_t> length = std::nullopt) {
  std::ofstream out(path, std::ios::binary);
  const std::uint64_t n = length.value_or(header.size());
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header << std::string(data_bytes, '\0');
}

TEST(SafetensorsHostile, EveryBrokenFileIsAClearError) {
  TempDir dir;
  const auto f = dir / "bad.safetensors";
  auto check = [&](const std::string& expected) {
    const auto message = error_of([&] { ckpt::SafetensorsFile::open(f); });
    EXPECT_NE(message.find(f.string()), std::string::npos) << message;
    EXPECT_NE(message.find(expected), std::string::npos) << "expected '" << expected << "' in: " << message;
  };
  std::ofstream(f) << "abc";
  check("shorter than the 8-byte header length");
  write_raw(f, "{}", 0, std::uint64_t{9'000'000'000'000'000'000ull});
  check("header length 9000000000000000000 exceeds the file size");
  write_raw(f, "not json", 0);
  check("not valid JSON");
  write_raw(f, R"([1,2])", 0);
  check("not a JSON object");
  write_raw(f, R"({"w":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}})", 4);
  check("unknown dtype 'F99'");
  write_raw(f, R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4);
  check("non-natural number");
  write_raw(f, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4);
  check("needs 8 bytes but data_offsets span 4");
  write_raw(f, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 2);
  check("past the end of the data");
  write_raw(f, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
  check("overlaps the previous tensor");
  write_raw(f, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
  check("4 unreferenced bytes before tensor 'a'");
  write_raw(f, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 6);
  check("trailing garbage");
  write_raw(f, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8);
  check("end before they begin");
  write_raw(f, R"({"a":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,4]}})", 4);
  check("overflows");
  write_raw(f, R"({"__metadata__":{"k":1}})", 0);
  check("is not a string");
}

TEST(SafetensorsHostile, DuplicatesDepthOverflowAndBoolsAreClearErrors) {
  TempDir dir;
  const auto f = dir / "bad.safetensors";
  auto check = [&](const std::string& expected) {
    const auto message = error_of([&] { ckpt::SafetensorsFile::open(f).tensors(); });
    EXPECT_NE(message.find(f.string()), std::string::npos) << message;
    EXPECT_NE(message.find(expected), std::string::npos) << "expected '" << expected << "' in: " << message;
  };
  write_raw(f, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
  check("tensor name 'a' appears twice");
  write_raw(f, R"({"a":{"dtype":"F32","shape":[1],"shape":[1],"data_offsets":[0,4]}})", 4);
  check("'shape' appears twice");
  write_raw(f, R"({"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})", 4);
  check("nesting deeper than the format allows");
  write_raw(f, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":{"x":1}}})", 4);
  check("nesting deeper than the format allows");
  write_raw(f, R"({"a":{"dtype":"F32","shape":[0,4611686018427387904,4611686018427387904],"data_offsets":[0,0]}})", 0);
  check("overflows");
  write_raw(f, R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4);
  check("shape holds a non-natural number (a fractional number)");
  std::string bools = R"({"b":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})";
  {
    std::ofstream out(f, std::ios::binary);
    const std::uint64_t n = bools.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
    out << bools << '\1' << '\2' << '\0';
  }
  check("BOOL tensor 'b' holds the byte 2 at element 1");
  // Unknown scalar fields are ignored, as the format's other readers do.
  write_raw(f, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"note":"x"}})", 4);
  EXPECT_NO_THROW(ckpt::SafetensorsFile::open(f));
}

TEST(SafetensorsHostile, AFailedModelLoadChangesNothing) {
  TempDir dir;
  TinyNet net;
  const auto before = accelerate::testing::flat_parameters(*net);
  // A duplicate name: the second copy would have won with a DOM parse.
  const std::string header = R"({"fc1.weight":{"dtype":"F32","shape":[16,8],"data_offsets":[0,512]},"fc1.weight":{"dtype":"F32","shape":[16,8],"data_offsets":[512,1024]}})";
  write_raw(dir / "model.safetensors", header, 1024);
  EXPECT_NE(error_of([&] { accelerate::load_checkpoint_in_model(*net, dir / "model.safetensors"); }).find("appears twice"),
            std::string::npos);
  EXPECT_TRUE(torch::equal(before, accelerate::testing::flat_parameters(*net)));
}

// The header parser's memory stays a small multiple of the header: measured in a child
// process (its peak resident size against what it inherited), for the 99 MB header of nested
// arrays that made a DOM parse allocate 3.7 GB.
TEST(SafetensorsHostile, AHugeNestedHeaderCostsLittleMemory) {
  TempDir dir;
  const auto f = dir / "nested.safetensors";
  const std::size_t depth = 99'000'000 / 2 - 16;
  {
    std::string header = R"({"a":{"shape":)" + std::string(depth, '[') + std::string(depth, ']') + "}}";
    write_raw(f, header, 0);
  }
  auto resident_kib = [] {
    long pages = 0, resident = 0;
    std::ifstream("/proc/self/statm") >> pages >> resident;
    return resident * (::sysconf(_SC_PAGESIZE) / 1024);
  };
  const long inherited = resident_kib();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const auto message = error_of([&] { ckpt::SafetensorsFile::open(f); });
    ::_exit(message.find("nesting deeper") != std::string::npos ? 0 : 3);
  }
  int status = 0;
  struct rusage usage {};
  ASSERT_EQ(::wait4(child, &status, 0, &usage), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the nested header is refused for its nesting";
  const long grew_kib = usage.ru_maxrss - inherited;
  EXPECT_LT(grew_kib, 3 * 99'000) << "peak grew by " << grew_kib << " KiB for a 99 MB header";
}

TEST(SafetensorsHostile, LinksLoopsAndFifosAreRefusedAtOnce) {
  TempDir dir;
  std::filesystem::create_symlink(dir / "b.safetensors", dir / "a.safetensors");
  std::filesystem::create_symlink(dir / "a.safetensors", dir / "b.safetensors");
  EXPECT_NE(error_of([&] { ckpt::SafetensorsFile::open(dir / "a.safetensors"); }).find("symlink loop"), std::string::npos);
  TinyNet net;
  EXPECT_NE(error_of([&] { accelerate::load_checkpoint_in_model(*net, dir / "a.safetensors"); }).find("symlink loop"),
            std::string::npos);
  const auto fifo = dir / "fifo.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(error_of([&] { ckpt::SafetensorsFile::open(fifo); }).find("is not a regular file"), std::string::npos);
  EXPECT_NE(error_of([&] { accelerate::load_checkpoint_in_model(*net, fifo); }).find("is not a regular file"),
            std::string::npos);
  const auto index = dir / "model.safetensors.index.json";
  ASSERT_EQ(::mkfifo(index.c_str(), 0600), 0);
  EXPECT_NE(error_of([&] { accelerate::load_checkpoint_in_model(*net, index); }).find("is not a regular file"),
            std::string::npos);
}

// Tensors read from a file are private copies-on-write of its mapping: in-place updates work
// (they crashed with SIGSEGV on a read-only mapping), never reach the file, and the tensor
// outlives the file object.
TEST(Safetensors, LoadedTensorsAreWritableAndOutliveTheFile) {
  TempDir dir;
  const auto f = dir / "w.safetensors";
  ckpt::save_safetensors(f, {{"w", torch::arange(4, torch::kFloat)}});
  at::Tensor kept;
  {
    auto file = ckpt::SafetensorsFile::open(f);
    kept = file.tensor("w");
    kept.add_(1);
  }
  kept.mul_(2);
  EXPECT_TRUE(torch::equal(kept, torch::tensor({2.f, 4.f, 6.f, 8.f})));
  EXPECT_TRUE(torch::equal(ckpt::SafetensorsFile::open(f).tensor("w"), torch::arange(4, torch::kFloat)))
      << "the file is unchanged";
}

TEST(SafetensorsHostile, FlippedBitsAreCaughtOrHarmless) {
  // Flip every bit of the header of a valid file, one at a time: each result either opens
  // (a still-valid header) or raises accelerate::Error; nothing crashes.
  TempDir dir;
  const auto good = dir / "good.safetensors";
  ckpt::save_safetensors(good, {{"a", torch::arange(6, torch::kFloat)}, {"b", torch::ones({2}, torch::kLong)}});
  std::ifstream in(good, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::uint64_t header = 0;
  for (int i = 0; i < 8; ++i) header |= std::uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  int rejected = 0;
  for (std::size_t i = 0; i < 8 + header; ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = bytes;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      std::ofstream(dir / "x.safetensors", std::ios::binary) << flipped;
      try {
        auto file = ckpt::SafetensorsFile::open(dir / "x.safetensors");
        for (const auto& name : file.names()) (void)file.tensor(name).sum();
      } catch (const accelerate::Error&) {
        ++rejected;
      }
    }
  }
  EXPECT_GT(rejected, 0);
}

}  // namespace
