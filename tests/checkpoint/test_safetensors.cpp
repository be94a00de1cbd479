// The safetensors reader: round trips of random tensors of every dtype, and every malformed file or index
// giving an Error that names the file and the tensor (run these under ASan/UBSan: no out-of-bounds reads).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/safetensors.h"
#include "util/error.h"
#include "util/mapped_file.h"

namespace beamline {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("beamline_st_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::vector<std::byte> random_bytes(std::size_t count, std::mt19937_64& rng) {
    std::vector<std::byte> bytes(count);
    for (auto& b : bytes) b = static_cast<std::byte>(rng() & 0xff);
    return bytes;
  }

  static std::string read_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  static void write_file(const fs::path& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  static std::string length_prefix(uint64_t length) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
    return out;
  }
  // A file with exactly this header text followed by `data_bytes` bytes of data.
  fs::path write_raw(const std::string& name, const std::string& header, std::size_t data_bytes) {
    const fs::path path = dir_ / name;
    write_file(path, length_prefix(header.size()) + header + std::string(data_bytes, '\x11'));
    return path;
  }

  // Expects open(path) to throw with a message containing every fragment.
  static void expect_error(const fs::path& path, const std::vector<std::string>& fragments) {
    try {
      SafetensorsArchive::open(path);
      ADD_FAILURE() << "opened " << path << " without error";
    } catch (const Error& error) {
      const std::string message = error.what();
      for (const std::string& fragment : fragments)
        EXPECT_NE(message.find(fragment), std::string::npos) << "missing \"" << fragment << "\" in: " << message;
    }
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, RandomTensorsOfEveryDtypeRoundTrip) {
  std::mt19937_64 rng(42);
  const std::vector<DType> dtypes = {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3,
                                     DType::F8_E8M0, DType::U8, DType::I32, DType::I64};
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<TensorSource> tensors;
    std::map<std::string, std::vector<std::byte>> expected;
    std::map<std::string, std::pair<DType, std::vector<int64_t>>> expected_meta;
    for (int i = 0; i < 12; ++i) {
      const DType dtype = dtypes[rng() % dtypes.size()];
      std::vector<int64_t> shape;
      const int rank = static_cast<int>(rng() % 4);
      for (int d = 0; d < rank; ++d) shape.push_back(static_cast<int64_t>(rng() % 7));  // zero-sized dims too
      int64_t numel = 1;
      for (int64_t dim : shape) numel *= dim;
      auto bytes = random_bytes(static_cast<std::size_t>(numel) * dtype_size(dtype), rng);
      const std::string name = fmt::format("t{}.w{}", trial, i);
      expected[name] = bytes;
      expected_meta[name] = {dtype, shape};
      tensors.push_back(tensor_from_bytes(name, dtype, shape, std::move(bytes)));
    }
    const fs::path file = dir_ / fmt::format("round{}.safetensors", trial);
    write_safetensors(file, tensors);
    const auto archive = SafetensorsArchive::open(file);
    ASSERT_EQ(archive->tensor_count(), tensors.size());
    for (const auto& [name, bytes] : expected) {
      const TensorView& view = archive->at(name);
      EXPECT_EQ(view.name, name);
      EXPECT_EQ(view.dtype, expected_meta[name].first);
      EXPECT_EQ(view.shape, expected_meta[name].second);
      ASSERT_EQ(view.nbytes, bytes.size());
      EXPECT_TRUE(bytes.empty() || std::memcmp(view.data, bytes.data(), bytes.size()) == 0) << name;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(view.data) % dtype_size(view.dtype), 0u) << name;
      EXPECT_EQ(archive->file_of(name), file);
    }
    const auto names = archive->tensor_names();
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
    EXPECT_EQ(archive->find("absent"), nullptr);
    EXPECT_THROW(archive->at("absent"), Error);
  }
}

TEST_F(SafetensorsTest, MappedFileErrorsNameThePath) {
  try {
    MappedFile file(dir_ / "nothing.bin");
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("nothing.bin: cannot open: No such file or directory"), std::string::npos)
        << error.what();
  }
  EXPECT_THROW(MappedFile file(dir_), Error);
  write_file(dir_ / "empty.bin", "");
  MappedFile empty(dir_ / "empty.bin");
  EXPECT_EQ(empty.size(), 0u);
  MappedFile moved = std::move(empty);
  EXPECT_EQ(moved.path(), dir_ / "empty.bin");
}

TEST_F(SafetensorsTest, TruncatedFiles) {
  std::mt19937_64 rng(7);
  write_safetensors(dir_ / "good.safetensors",
                    {tensor_from_bytes("alpha", DType::F32, {4, 4}, random_bytes(64, rng)),
                     tensor_from_bytes("beta", DType::BF16, {3}, random_bytes(6, rng))});
  const std::string good = read_file(dir_ / "good.safetensors");
  // Cut inside the data: the last tensor by offset (the BF16 one) reaches past the end.
  write_file(dir_ / "cut_data.safetensors", good.substr(0, good.size() - 3));
  expect_error(dir_ / "cut_data.safetensors", {"cut_data.safetensors", "tensor \"beta\"", "past the end", "truncated"});
  // Cut inside the header.
  write_file(dir_ / "cut_header.safetensors", good.substr(0, 20));
  expect_error(dir_ / "cut_header.safetensors", {"cut_header.safetensors", "header length", "larger than the 12 bytes"});
  write_file(dir_ / "tiny.safetensors", good.substr(0, 5));
  expect_error(dir_ / "tiny.safetensors", {"tiny.safetensors", "truncated: 5 bytes"});
  write_file(dir_ / "empty.safetensors", "");
  expect_error(dir_ / "empty.safetensors", {"empty.safetensors", "truncated: 0 bytes"});
  // Every prefix of a valid file is rejected without a crash.
  for (std::size_t size = 0; size < good.size(); ++size) {
    write_file(dir_ / "prefix.safetensors", good.substr(0, size));
    EXPECT_THROW(SafetensorsArchive::open(dir_ / "prefix.safetensors"), Error) << size;
  }
}

TEST_F(SafetensorsTest, HugeHeaderLength) {
  for (uint64_t length : {uint64_t{1} << 40, ~uint64_t{0}, uint64_t{1} << 63}) {
    write_file(dir_ / "huge.safetensors", length_prefix(length) + "{}");
    expect_error(dir_ / "huge.safetensors", {"huge.safetensors", fmt::format("header length {}", length)});
  }
}

TEST_F(SafetensorsTest, BadJsonHeaders) {
  expect_error(write_raw("syntax.safetensors", "{\"a\": {\"dtype\": ", 0), {"syntax.safetensors", "not valid JSON"});
  expect_error(write_raw("array.safetensors", "[1, 2]", 0), {"array.safetensors", "must be a JSON object"});
  expect_error(write_raw("binary.safetensors", std::string("{\0\0}", 4), 0), {"binary.safetensors", "not valid JSON"});
  expect_error(write_raw("entry.safetensors", R"({"w": 5})", 0), {"entry.safetensors", "tensor \"w\"", "must be an object"});
  expect_error(write_raw("nodtype.safetensors", R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4),
               {"nodtype.safetensors", "tensor \"w\"", "dtype"});
  expect_error(write_raw("noshape.safetensors", R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4),
               {"noshape.safetensors", "tensor \"w\"", "shape"});
  expect_error(write_raw("nooffsets.safetensors", R"({"w": {"dtype": "F32", "shape": [1]}})", 4),
               {"nooffsets.safetensors", "tensor \"w\"", "data_offsets"});
  expect_error(write_raw("offsets3.safetensors", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", 4),
               {"offsets3.safetensors", "tensor \"w\"", "data_offsets"});
  expect_error(write_raw("negoffset.safetensors", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4),
               {"negoffset.safetensors", "tensor \"w\"", "data_offsets"});
  expect_error(write_raw("negshape.safetensors", R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
               {"negshape.safetensors", "tensor \"w\"", "not a non-negative integer"});
  expect_error(write_raw("floatshape.safetensors", R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4),
               {"floatshape.safetensors", "tensor \"w\""});
}

TEST_F(SafetensorsTest, UnknownDtype) {
  expect_error(write_raw("dtype.safetensors", R"({"w": {"dtype": "F7", "shape": [2], "data_offsets": [0, 2]}})", 2),
               {"dtype.safetensors", "tensor \"w\"", "unknown dtype \"F7\""});
}

TEST_F(SafetensorsTest, HeaderLiesAboutSizes) {
  // Shape says 16 bytes, offsets say 12.
  expect_error(write_raw("size.safetensors", R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})", 12),
               {"size.safetensors", "tensor \"w\"", "needs 16 bytes", "hold 12"});
  // Offsets beyond the data section.
  expect_error(write_raw("range.safetensors", R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", 16),
               {"range.safetensors", "tensor \"w\"", "past the end of the data section (16 bytes)"});
  expect_error(write_raw("reversed.safetensors", R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}})", 4),
               {"reversed.safetensors", "tensor \"w\"", "end before they begin"});
  // Shape whose byte size overflows 64 bits.
  expect_error(write_raw("overflow.safetensors",
                         R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 0]}})", 0),
               {"overflow.safetensors", "tensor \"w\"", "overflows"});
  expect_error(write_raw("overflow2.safetensors",
                         R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", 0),
               {"overflow2.safetensors", "tensor \"w\"", "overflows"});
  expect_error(write_raw("hugeoffset.safetensors",
                         R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [18446744073709551612, 18446744073709551615]}})", 4),
               {"hugeoffset.safetensors", "tensor \"w\""});
}

TEST_F(SafetensorsTest, OverlapsHolesAndTrailingBytes) {
  expect_error(write_raw("overlap.safetensors",
                         R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                             "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12),
               {"overlap.safetensors", "tensor \"b\"", "overlap", "tensor \"a\""});
  expect_error(write_raw("same.safetensors",
                         R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                             "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 8),
               {"same.safetensors", "overlap"});
  expect_error(write_raw("hole.safetensors",
                         R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                             "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})", 12),
               {"hole.safetensors", "tensor \"b\"", "leave bytes [4, 8)"});
  expect_error(write_raw("trailing.safetensors", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 9),
               {"trailing.safetensors", "cover 4 bytes", "holds 9"});
  std::string misaligned = R"({"a": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]},
                                "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})";
  misaligned.append((8 - misaligned.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  expect_error(write_raw("misaligned.safetensors", misaligned, 6),
               {"misaligned.safetensors", "tensor \"b\"", "not aligned to its 4-byte F32 elements"});
}

TEST_F(SafetensorsTest, MetadataIsSkipped) {
  const auto archive = SafetensorsArchive::open(write_raw(
      "meta.safetensors", R"({"__metadata__": {"format": "pt"}, "w": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]}})", 3));
  EXPECT_EQ(archive->tensor_count(), 1u);
  EXPECT_EQ(archive->at("w").shape, std::vector<int64_t>{3});
}

// Random byte flips and cuts in a valid file: always either a clean Error or a valid archive whose
// views lie inside the file.
TEST_F(SafetensorsTest, RandomCorruptionsNeverReadOutOfBounds) {
  std::mt19937_64 rng(99);
  write_safetensors(dir_ / "base.safetensors",
                    {tensor_from_bytes("layer.0.w", DType::BF16, {8, 3}, random_bytes(48, rng)),
                     tensor_from_bytes("layer.0.b", DType::F32, {5}, random_bytes(20, rng)),
                     tensor_from_bytes("codes", DType::U8, {4, 2}, random_bytes(8, rng))});
  const std::string base = read_file(dir_ / "base.safetensors");
  int rejected = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string bytes = base;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      const std::size_t at = rng() % std::min<std::size_t>(bytes.size(), 200);  // mostly the header
      bytes[at] = trial % 2 ? static_cast<char>(rng() & 0xff) : "0123456789,:[]{}\""[rng() % 17];
    }
    if (trial % 5 == 0) bytes.resize(rng() % bytes.size());
    const fs::path path = dir_ / "fuzz.safetensors";
    write_file(path, bytes);
    try {
      const auto archive = SafetensorsArchive::open(path);
      // Accepted: each view must hold exactly the bytes its header entry names, read independently here.
      uint64_t header_length = 0;
      for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | static_cast<unsigned char>(bytes[i]);
      const json header = json::parse(bytes.substr(8, header_length));
      for (const std::string& name : archive->tensor_names()) {
        const TensorView& view = archive->at(name);
        const uint64_t begin = header.at(name).at("data_offsets")[0].get<uint64_t>();
        ASSERT_LE(8 + header_length + begin + view.nbytes, bytes.size()) << name;
        EXPECT_EQ(std::memcmp(view.data, bytes.data() + 8 + header_length + begin, view.nbytes), 0) << name;
      }
    } catch (const Error& error) {
      ++rejected;
      EXPECT_NE(std::string(error.what()).find("fuzz.safetensors"), std::string::npos) << error.what();
    }
  }
  EXPECT_GT(rejected, 100);
}

class ShardedTest : public SafetensorsTest {
 protected:
  // Two shards: "a" and "b" in the first, "c" in the second, and an index listing them.
  void write_two_shards() {
    std::mt19937_64 rng(5);
    write_safetensors(dir_ / "model-00001-of-00002.safetensors",
                      {tensor_from_bytes("a", DType::F32, {2}, random_bytes(8, rng)),
                       tensor_from_bytes("b", DType::BF16, {3, 2}, random_bytes(12, rng))});
    write_safetensors(dir_ / "model-00002-of-00002.safetensors", {tensor_from_bytes("c", DType::U8, {5}, random_bytes(5, rng))});
    write_index({{"a", "model-00001-of-00002.safetensors"},
                 {"b", "model-00001-of-00002.safetensors"},
                 {"c", "model-00002-of-00002.safetensors"}});
  }
  void write_index(const json& weight_map) {
    write_file(dir_ / "model.safetensors.index.json", json{{"metadata", json::object()}, {"weight_map", weight_map}}.dump());
  }
};

TEST_F(ShardedTest, IndexedShardsOpen) {
  write_two_shards();
  const auto archive = SafetensorsArchive::open(dir_);
  EXPECT_EQ(archive->tensor_count(), 3u);
  EXPECT_EQ(archive->file_of("a"), dir_ / "model-00001-of-00002.safetensors");
  EXPECT_EQ(archive->file_of("c"), dir_ / "model-00002-of-00002.safetensors");
  EXPECT_EQ(archive->at("b").shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(archive->files().size(), 2u);
}

TEST_F(ShardedTest, ShardedWriterRoundTrip) {
  std::mt19937_64 rng(11);
  std::vector<TensorSource> tensors;
  std::vector<std::vector<std::byte>> contents;
  for (int i = 0; i < 10; ++i) {
    contents.push_back(random_bytes(400, rng));
    tensors.push_back(tensor_from_bytes(fmt::format("w{}", i), DType::F32, {10, 10}, contents.back()));
  }
  const auto files = write_safetensors_checkpoint(dir_, tensors, 1000);  // two tensors per shard
  EXPECT_EQ(files.size(), 6u);
  EXPECT_TRUE(fs::exists(dir_ / "model-00005-of-00005.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors"));
  const auto archive = SafetensorsArchive::open(dir_);
  for (int i = 0; i < 10; ++i) {
    const TensorView& view = archive->at(fmt::format("w{}", i));
    EXPECT_EQ(std::memcmp(view.data, contents[i].data(), 400), 0);
    EXPECT_EQ(archive->file_of(view.name).filename(), safetensors_shard_name(i / 2, 5));
  }
  // Rewriting as one file replaces the shards and the index.
  write_safetensors_checkpoint(dir_, tensors);
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir_ / "model-00001-of-00005.safetensors"));
  EXPECT_EQ(SafetensorsArchive::open(dir_)->files(), std::vector<fs::path>{dir_ / "model.safetensors"});
}

TEST_F(ShardedTest, IndexPointsAtMissingFile) {
  write_two_shards();
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  expect_error(dir_, {"model.safetensors.index.json", "tensor \"c\"", "model-00002-of-00002.safetensors", "No such file"});
}

TEST_F(ShardedTest, TensorMissingFromItsShard) {
  write_two_shards();
  write_index({{"a", "model-00001-of-00002.safetensors"},
               {"c", "model-00001-of-00002.safetensors"},
               {"b", "model-00001-of-00002.safetensors"}});
  expect_error(dir_, {"model.safetensors.index.json", "tensor \"c\"", "model-00001-of-00002.safetensors", "no such tensor"});
}

TEST_F(ShardedTest, CorruptShardNamesTheShardAndTensor) {
  write_two_shards();
  std::string shard = read_file(dir_ / "model-00002-of-00002.safetensors");
  write_file(dir_ / "model-00002-of-00002.safetensors", shard.substr(0, shard.size() - 1));
  expect_error(dir_, {"model-00002-of-00002.safetensors", "tensor \"c\"", "past the end"});
}

TEST_F(ShardedTest, MalformedIndexes) {
  write_two_shards();
  write_file(dir_ / "model.safetensors.index.json", "{\"weight_map\": ");
  expect_error(dir_, {"model.safetensors.index.json", "invalid JSON"});
  write_file(dir_ / "model.safetensors.index.json", "{\"metadata\": {}}");
  expect_error(dir_, {"model.safetensors.index.json", "\"weight_map\""});
  write_file(dir_ / "model.safetensors.index.json", "[]");
  expect_error(dir_, {"model.safetensors.index.json", "JSON object"});
  write_index(json::object());
  expect_error(dir_, {"model.safetensors.index.json", "lists no tensors"});
  write_index({{"a", 3}});
  expect_error(dir_, {"model.safetensors.index.json", "tensor \"a\"", "file name"});
  write_index({{"a", "../outside.safetensors"}});
  expect_error(dir_, {"model.safetensors.index.json", "tensor \"a\"", "not a file name in the checkpoint directory"});
  write_index({{"a", ""}});
  expect_error(dir_, {"model.safetensors.index.json", "tensor \"a\""});
}

TEST_F(ShardedTest, UnlistedShardTensorsAreIgnored) {
  write_two_shards();
  write_index({{"a", "model-00001-of-00002.safetensors"}, {"c", "model-00002-of-00002.safetensors"}});
  const auto archive = SafetensorsArchive::open(dir_);
  EXPECT_EQ(archive->tensor_names(), (std::vector<std::string>{"a", "c"}));
}

TEST_F(SafetensorsTest, DirectoryWithoutWeights) {
  expect_error(dir_, {dir_.string(), "neither model.safetensors nor model.safetensors.index.json"});
  expect_error(dir_ / "absent.safetensors", {"absent.safetensors", "cannot open"});
}

}  // namespace
}  // namespace beamline
