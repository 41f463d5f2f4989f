// safetensors reader: good files (single, sharded, every dtype) and malformed ones (one-line errors naming the
// file and the tensor). Files are written into a fresh temp dir per test by the small writer below.
#include "format/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace latent {
namespace {

namespace fs = std::filesystem;

struct Spec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes;
};

// Raw file: u64 LE header length, header bytes, data bytes.
void write_raw(const fs::path& p, const std::string& header, const std::string& data, uint64_t len) {
  std::ofstream out(p, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out << header << data;
}
void write_raw(const fs::path& p, const std::string& header, const std::string& data = "") {
  write_raw(p, header, data, header.size());
}

// A well-formed file: tensors laid out back to back, data byte i = (i * 7 + 3) & 0xff, header space-padded to 8.
void write_st(const fs::path& p, const std::vector<Spec>& tensors, const nlohmann::json& metadata = nullptr) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.is_null()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& t : tensors) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.nbytes}}};
    off += t.nbytes;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string data(off, '\0');
  for (uint64_t i = 0; i < off; ++i) data[i] = static_cast<char>((i * 7 + 3) & 0xff);
  write_raw(p, header, data);
}

// One tensor entry as header JSON text.
std::string entry(const std::string& name, const std::string& body) { return "\"" + name + "\":" + body; }

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("latent_st_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes `header` (JSON text) with `data_size` zero bytes of data to bad.safetensors and expects one error.
  void expect_header_error(const std::string& header, uint64_t data_size, std::vector<std::string> parts) {
    write_raw(dir_ / "bad.safetensors", header, std::string(data_size, '\0'));
    parts.insert(parts.begin(), path("bad.safetensors"));
    expect_error([&] { SafetensorsFile f(path("bad.safetensors")); }, parts);
  }

  static void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one containing '" << parts.front() << "'";
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (std::getenv("LATENT_SHOW_ERRORS")) std::printf("  error: %s\n", msg.c_str());
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_NO_THROW((void)nlohmann::json(msg).dump()) << "not valid UTF-8: " << msg;
      for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    }
  }

  fs::path dir_;
};

// --- good files ------------------------------------------------------------------------------------------------

TEST_F(Safetensors, SingleFileInPlace) {
  write_st(dir_ / "m.safetensors", {{"b.weight", "BF16", {2, 3}, 12}, {"a.bias", "F32", {3}, 12}}, {{"format", "pt"}});
  SafetensorsFile f(path("m.safetensors"));
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].name, "b.weight");  // header order
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.data_offset() % 8, 0u);
  const TensorInfo* a = f.find("a.bias");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(f.find("nope"), nullptr);
  const TensorView va = f.view(*a);
  const TensorView vb = f.view(*f.find("b.weight"));
  EXPECT_EQ(va.dtype, DType::F32);
  EXPECT_EQ(va.shape, (Shape{3}));
  EXPECT_EQ(va.nbytes, 12u);
  EXPECT_EQ(vb.bytes() + 12, va.bytes());  // both point into one mapping: nothing copied
  for (uint64_t i = 0; i < 12; ++i) EXPECT_EQ(va.bytes()[i], ((12 + i) * 7 + 3) & 0xff);

  Checkpoint c = Checkpoint::open(path("m.safetensors"));
  EXPECT_EQ(c.dir(), dir_.string());
  EXPECT_EQ(c.num_files(), 1u);
  EXPECT_EQ(c.names(), (std::vector<std::string>{"a.bias", "b.weight"}));
  EXPECT_EQ(c.total_bytes(), 24u);
  EXPECT_EQ(std::memcmp(c.view("a.bias").data, va.data, 12), 0);
  EXPECT_EQ(c.info("b.weight").dtype, DType::BF16);
  EXPECT_EQ(c.file_of("b.weight"), path("m.safetensors"));
  EXPECT_FALSE(c.has("x"));
  expect_error([&] { c.view("x.weight"); }, {path("m.safetensors"), "'x.weight'", "not found"});
}

TEST_F(Safetensors, EveryDtype) {
  const std::vector<std::tuple<std::string, DType, uint64_t>> cases = {
      {"F64", DType::F64, 8},         {"F32", DType::F32, 4},         {"F16", DType::F16, 2},
      {"BF16", DType::BF16, 2},       {"F8_E4M3", DType::F8_E4M3, 1}, {"F8_E5M2", DType::F8_E5M2, 1},
      {"F8_E8M0", DType::F8_E8M0, 1}, {"I64", DType::I64, 8},         {"I32", DType::I32, 4},
      {"I16", DType::I16, 2},         {"I8", DType::I8, 1},           {"U64", DType::U64, 8},
      {"U32", DType::U32, 4},         {"U16", DType::U16, 2},         {"U8", DType::U8, 1},
      {"BOOL", DType::BOOL, 1}};
  std::vector<Spec> specs;
  for (const auto& [name, dt, bytes] : cases) specs.push_back({"t." + name, name, {3, 2}, 6 * bytes});
  specs.push_back({"t.F4", "F4", {3, 4}, 6});  // logical elements: 12 codes in 6 bytes
  write_st(dir_ / "m.safetensors", specs);
  SafetensorsFile f(path("m.safetensors"));
  for (const auto& [name, dt, bytes] : cases) {
    const TensorInfo* t = f.find("t." + name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, dt) << name;
    EXPECT_EQ(f.view(*t).nbytes, 6 * bytes) << name;
  }
  EXPECT_EQ(f.find("t.F4")->dtype, DType::F4_E2M1);
  EXPECT_EQ(f.find("t.F4")->shape, (Shape{3, 4}));
}

TEST_F(Safetensors, F4ShapeCountingPackedBytesIsInferred) {
  write_st(dir_ / "m.safetensors", {{"w", "F4", {3, 4}, 12}});  // 12 bytes for a [3, 4] shape: packed pairs
  SafetensorsFile f(path("m.safetensors"));
  EXPECT_EQ(f.tensors()[0].shape, (Shape{3, 8}));
  EXPECT_EQ(f.view(f.tensors()[0]).nbytes, 12u);
}

TEST_F(Safetensors, ScalarEmptyAndAliases) {
  write_st(dir_ / "m.safetensors",
           {{"s", "F32", {}, 4}, {"z", "BF16", {0, 5}, 0}, {"z2", "U8", {4, 0}, 0}, {"e", "F8_E8M0FNU", {2}, 2}});
  SafetensorsFile f(path("m.safetensors"));
  EXPECT_EQ(f.find("s")->shape.ndim, 0);
  EXPECT_EQ(f.view(*f.find("s")).numel(), 1);
  EXPECT_EQ(f.find("z")->begin, f.find("z2")->begin);  // empty tensors may share offsets
  EXPECT_EQ(f.find("e")->dtype, DType::F8_E8M0);
}

TEST_F(Safetensors, EmptyHeaderIsValid) {
  write_raw(dir_ / "m.safetensors", "{}");
  SafetensorsFile f(path("m.safetensors"));
  EXPECT_TRUE(f.tensors().empty());
}

TEST_F(Safetensors, ShardedWithIndex) {
  write_st(dir_ / "model-00001-of-00002.safetensors", {{"a", "BF16", {4}, 8}, {"b", "F32", {2}, 8}});
  write_st(dir_ / "model-00002-of-00002.safetensors", {{"c", "U8", {16}, 16}});
  write_st(dir_ / "stray.safetensors", {{"zz", "U8", {1}, 1}});  // not in the index: ignored
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"metadata": {"total_size": 32}, "weight_map": {"a": "model-00001-of-00002.safetensors",
            "c": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}})";
  std::ofstream(dir_ / "config.json") << "{}";
  Checkpoint c = Checkpoint::open(dir_.string());
  EXPECT_EQ(c.dir(), dir_.string());
  EXPECT_EQ(c.num_files(), 2u);
  EXPECT_EQ(c.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(c.file_of("c"), path("model-00002-of-00002.safetensors"));
  EXPECT_EQ(c.view("c").nbytes, 16u);
  EXPECT_EQ(c.total_bytes(), 32u);
  EXPECT_FALSE(c.has("zz"));
}

TEST_F(Safetensors, DirWithSingleModelFile) {
  write_st(dir_ / "model.safetensors", {{"a", "BF16", {4}, 8}});
  write_st(dir_ / "other.safetensors", {{"a", "BF16", {4}, 8}});  // model.safetensors wins; no clash
  Checkpoint c = Checkpoint::open(dir_.string());
  EXPECT_EQ(c.num_files(), 1u);
  EXPECT_EQ(c.file_of("a"), path("model.safetensors"));
}

TEST_F(Safetensors, DirWithoutIndexReadsAllFilesSorted) {
  write_st(dir_ / "b.safetensors", {{"y", "U8", {1}, 1}});
  write_st(dir_ / "a.safetensors", {{"x", "U8", {1}, 1}});
  std::ofstream(dir_ / "notes.txt") << "x";
  Checkpoint c = Checkpoint::open(dir_.string());
  EXPECT_EQ(c.num_files(), 2u);
  EXPECT_EQ(c.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(c.file_of("y"), path("b.safetensors"));
}

TEST_F(Safetensors, ParseHeaderDirectly) {
  auto h = parse_safetensors_header(R"({"w": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}})", 2, "mem");
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.tensors[0].dtype, DType::I8);
  expect_error([] { parse_safetensors_header("[]", 0, "mem"); }, {"mem", "JSON object"});
}

// --- malformed files: file-level -------------------------------------------------------------------------------

TEST_F(Safetensors, TruncatedFile) {
  std::ofstream(dir_ / "bad.safetensors") << "abc";
  expect_error([&] { SafetensorsFile f(path("bad.safetensors")); }, {path("bad.safetensors"), "too short"});
}

TEST_F(Safetensors, HeaderLengthPastEof) {
  write_raw(dir_ / "bad.safetensors", "{}", "", 1000);
  expect_error([&] { SafetensorsFile f(path("bad.safetensors")); }, {path("bad.safetensors"), "1000", "past the end"});
}

TEST_F(Safetensors, HeaderLengthZero) {
  write_raw(dir_ / "bad.safetensors", "{}", "", 0);
  expect_error([&] { SafetensorsFile f(path("bad.safetensors")); }, {path("bad.safetensors"), "minimum"});
}

TEST_F(Safetensors, HeaderLengthHuge) {
  write_raw(dir_ / "bad.safetensors", "{}", "", uint64_t{1} << 62);
  expect_error([&] { SafetensorsFile f(path("bad.safetensors")); }, {path("bad.safetensors"), "limit"});
}

TEST_F(Safetensors, MissingFile) {
  expect_error([&] { SafetensorsFile f(path("nope.safetensors")); }, {path("nope.safetensors")});
  expect_error([&] { Checkpoint::open(path("nope")); }, {path("nope"), "no such file"});
}

// --- malformed files: header -----------------------------------------------------------------------------------

TEST_F(Safetensors, BadJson) {
  expect_header_error(R"({"w": {"dtype": "F32",)", 0, {"not valid JSON"});
  expect_header_error("{\"w\xff\": 1}", 0, {"not valid JSON"});  // invalid UTF-8
  expect_header_error("{\"a\n\": {}", 0, {"not valid JSON"});    // raw control char: message stays one line
}

TEST_F(Safetensors, HeaderNotAnObject) { expect_header_error("[1, 2]", 0, {"must be a JSON object", "array"}); }

TEST_F(Safetensors, EntryNotAnObject) { expect_header_error(R"({"w": 5})", 0, {"tensor 'w'", "must be an object"}); }

TEST_F(Safetensors, MissingFields) {
  expect_header_error(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4, {"tensor 'w'", "missing 'dtype'"});
  expect_header_error(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4, {"tensor 'w'", "missing 'shape'"});
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [1]}})", 4, {"tensor 'w'", "missing 'data_offsets'"});
}

TEST_F(Safetensors, UnknownDtype) {
  expect_header_error(R"({"w": {"dtype": "F12", "shape": [1], "data_offsets": [0, 4]}})", 4,
                      {"tensor 'w'", "unknown dtype 'F12'", "F8_E4M3", "BF16"});
  expect_header_error(R"({"w": {"dtype": 3, "shape": [1], "data_offsets": [0, 4]}})", 4,
                      {"tensor 'w'", "'dtype' must be a string"});
}

TEST_F(Safetensors, BadShapeDims) {
  for (const std::string dim : {"-1", "1.0", "\"4\"", "1e3", "[1]", "18446744073709551616", "9223372036854775808"})
    expect_header_error(R"({"w": {"dtype": "U8", "shape": [2, )" + dim + R"(], "data_offsets": [0, 4]}})", 4,
                        {"tensor 'w'", "shape dim 1", "non-negative integers"});
  expect_header_error(R"({"w": {"dtype": "U8", "shape": 4, "data_offsets": [0, 4]}})", 4, {"tensor 'w'", "'shape'"});
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [1,1,1,1,1,1,4], "data_offsets": [0, 4]}})", 4,
                      {"tensor 'w'", "7 dims"});
}

TEST_F(Safetensors, NumelOverflow) {
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 4], "data_offsets": [0, 4]}})", 4,
                      {"tensor 'w'", "too many elements"});
}

TEST_F(Safetensors, BadDataOffsets) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [4, 2]}})", 8,
                      {"tensor 'w'", "begin is past end"});
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4, 8]}})", 8,
                      {"tensor 'w'", "[begin, end]"});
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, -4]}})", 8,
                      {"tensor 'w'", "non-negative integers"});
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0.0, 4]}})", 8,
                      {"tensor 'w'", "non-negative integers"});
}

TEST_F(Safetensors, OffsetsPastDataRegion) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}})", 8,
                      {"tensor 'w'", "past the data region (8 bytes)"});
}

TEST_F(Safetensors, WrongByteSize) {
  const std::string name = "model.layers.0.mlp.gate.weight";
  write_raw(dir_ / "model-00001-of-00002.safetensors",
            "{" + entry(name, R"({"dtype": "BF16", "shape": [8, 64], "data_offsets": [0, 1000]})") + "}",
            std::string(1000, '\0'));
  expect_error([&] { SafetensorsFile f(path("model-00001-of-00002.safetensors")); },
               {path("model-00001-of-00002.safetensors") + ": tensor '" + name +
                "': shape [8, 64] x bf16 needs 1024 bytes but data_offsets span 1000"});
}

TEST_F(Safetensors, F4OddElementCount) {
  expect_header_error(R"({"w": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}})", 2,
                      {"tensor 'w'", "whole storage blocks"});
}

TEST_F(Safetensors, OverlappingSpans) {
  expect_header_error("{" + entry("a", R"({"dtype": "U8", "shape": [8], "data_offsets": [0, 8]})") + "," +
                          entry("b", R"({"dtype": "U8", "shape": [8], "data_offsets": [4, 12]})") + "}",
                      12, {"tensor 'b'", "overlaps tensor 'a'"});
  expect_header_error("{" + entry("a", R"({"dtype": "U8", "shape": [8], "data_offsets": [0, 8]})") + "," +
                          entry("b", R"({"dtype": "U8", "shape": [2], "data_offsets": [2, 4]})") + "}",
                      12, {"tensor 'b'", "overlaps tensor 'a'"});
}

TEST_F(Safetensors, DuplicateNames) {
  expect_header_error("{" + entry("a", R"({"dtype": "U8", "shape": [4], "data_offsets": [0, 4]})") + "," +
                          entry("a", R"({"dtype": "U8", "shape": [4], "data_offsets": [4, 8]})") + "}",
                      8, {"duplicate tensor 'a'"});
  expect_header_error(R"({"w": {"dtype": "U8", "dtype": "I8", "shape": [4], "data_offsets": [0, 4]}})", 4,
                      {"tensor 'w'", "duplicate key 'dtype'"});
}

TEST_F(Safetensors, BadMetadata) {
  expect_header_error(R"({"__metadata__": {"format": 1}})", 0, {"__metadata__", "'format'", "string"});
  expect_header_error(R"({"__metadata__": ["pt"]})", 0, {"__metadata__", "object of strings"});
}

TEST_F(Safetensors, DeepNestingAndControlCharsInNames) {
  expect_header_error("{\"w\": " + std::string(100000, '[') + std::string(100000, ']') + "}", 0, {"nested deeper"});
  expect_header_error(R"({"a\nb": 5})", 0, {"tensor 'a\\x0ab'"});  // escaped: the message stays one line
}

// --- malformed checkpoints -------------------------------------------------------------------------------------

class ShardedBad : public Safetensors {
 protected:
  void SetUp() override {
    Safetensors::SetUp();
    write_st(dir_ / "s1.safetensors", {{"a", "BF16", {4}, 8}});
    write_st(dir_ / "s2.safetensors", {{"b", "U8", {4}, 4}});
  }
  void write_index(const std::string& text) { std::ofstream(dir_ / "model.safetensors.index.json") << text; }
  std::string index() const { return path("model.safetensors.index.json"); }
  void expect_open_error(const std::vector<std::string>& parts) {
    expect_error([&] { Checkpoint::open(dir_.string()); }, parts);
  }
};

TEST_F(ShardedBad, IndexBadJson) {
  write_index(R"({"weight_map": {"a": "s1.safetensors",}})");
  expect_open_error({index(), "not valid JSON"});
}

TEST_F(ShardedBad, IndexWeightMapMissingOrWrong) {
  write_index(R"({"metadata": {}})");
  expect_open_error({index(), "missing 'weight_map'"});
  write_index(R"({"weight_map": ["s1.safetensors"]})");
  expect_open_error({index(), "'weight_map' must be an object"});
  write_index(R"({"weight_map": {"a": 1}})");
  expect_open_error({index(), "tensor 'a'", "shard file name"});
  write_index(R"({"weight_map": {"a": "../s1.safetensors"}})");
  expect_open_error({index(), "tensor 'a'", "outside the checkpoint directory"});
  write_index(R"({"weight_map": {"a": "s1.safetensors", "a": "s2.safetensors"}})");
  expect_open_error({index(), "duplicate key 'a'"});
}

TEST_F(ShardedBad, IndexNamesMissingShard) {
  write_index(R"({"weight_map": {"a": "s1.safetensors", "b": "s3.safetensors"}})");
  expect_open_error({index(), "shard 's3.safetensors'", "tensor 'b'", "not found"});
}

TEST_F(ShardedBad, IndexNamesTensorMissingFromShard) {
  write_index(R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s2.safetensors"}})");
  expect_open_error({index(), "tensor 'c'", path("s2.safetensors"), "does not contain"});
}

TEST_F(ShardedBad, ShardTensorNotInIndex) {
  write_index(R"({"weight_map": {"a": "s1.safetensors"}})");
  write_st(dir_ / "s1.safetensors", {{"a", "BF16", {4}, 8}, {"extra", "U8", {1}, 1}});
  expect_open_error({path("s1.safetensors"), "tensor 'extra'", "not listed", index()});
}

TEST_F(ShardedBad, IndexListsTensorUnderAnotherShard) {
  write_st(dir_ / "s2.safetensors", {{"b", "U8", {4}, 4}, {"a", "BF16", {4}, 8}});
  write_index(R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_open_error({path("s2.safetensors"), "tensor 'a'", "under shard 's1.safetensors'"});
}

TEST_F(ShardedBad, SameTensorInTwoShardsWithoutIndex) {
  write_st(dir_ / "s2.safetensors", {{"a", "BF16", {4}, 8}});
  expect_open_error({"tensor 'a'", path("s1.safetensors"), path("s2.safetensors")});
}

TEST_F(ShardedBad, BadShardIsNamed) {
  write_raw(dir_ / "s2.safetensors", "{\"b\": 1}");
  expect_open_error({path("s2.safetensors"), "tensor 'b'"});
}

TEST_F(Safetensors, DirWithoutSafetensors) {
  std::ofstream(dir_ / "config.json") << "{}";
  fs::create_directories(dir_ / "sub.safetensors");  // a directory, not a file
  expect_error([&] { Checkpoint::open(dir_.string()); }, {dir_.string() + ": no .safetensors files"});
}

}  // namespace
}  // namespace latent
