#include "engine/safetensors.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

namespace trainerd::engine {
namespace {

namespace fs = std::filesystem;

using trainerd::testing::ExpectErrorContains;
using trainerd::testing::TempDir;

std::vector<std::string> FolderEntries(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) names.push_back(entry.path().filename());
  return names;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed"; }

  std::string PathOf(const std::string& name) const { return dir_.path() + "/" + name; }

  // Writes raw bytes as file `name`; returns its path.
  std::string WriteBytes(const std::string& name, const std::string& bytes) {
    std::string path = PathOf(name);
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }

  // Writes a crafted file: the 8-byte little-endian `header_length` (the real
  // header size when negative), `header`, then `buffer`.
  std::string WriteCrafted(const std::string& header, const std::string& buffer,
                           int64_t header_length = -1) {
    uint64_t n = header_length < 0 ? header.size() : static_cast<uint64_t>(header_length);
    std::string bytes;
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    return WriteBytes("crafted.safetensors", bytes + header + buffer);
  }

  Status OpenStatus(const std::string& path) { return SafetensorsFile::Open(path).status(); }

  TempDir dir_;
};

TEST_F(SafetensorsTest, RoundTripEveryDType) {
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64,
                       DType::kI32, DType::kI16, DType::kI8,   DType::kU8,  DType::kBool};
  std::vector<std::vector<unsigned char>> payloads;
  std::vector<TensorToWrite> tensors;
  for (DType d : all) {
    const size_t n = 2 * 3 * dtype_size(d);
    std::vector<unsigned char> bytes(n);
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<unsigned char>(i * 7 + dtype_size(d));
    if (d == DType::kBool) bytes = {0, 1, 1, 0, 1, 0};
    payloads.push_back(std::move(bytes));
    tensors.push_back({std::string("t_") + dtype_name(d), d, {2, 3}, payloads.back().data(), n});
  }
  const std::string path = PathOf("all.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  ASSERT_EQ((*file)->tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& v = (*file)->tensors()[i];
    SCOPED_TRACE(v.name);
    EXPECT_EQ(v.name, tensors[i].name);
    EXPECT_EQ(v.dtype, tensors[i].dtype);
    EXPECT_EQ(v.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(v.numel(), 6);
    ASSERT_EQ(v.nbytes, payloads[i].size());
    EXPECT_EQ(std::memcmp(v.data, payloads[i].data(), v.nbytes), 0);
    EXPECT_EQ((*file)->Find(v.name), &v);
  }
  EXPECT_EQ((*file)->path(), path);
}

TEST_F(SafetensorsTest, DTypeNamesAndSizes) {
  EXPECT_STREQ(dtype_name(DType::kBF16), "BF16");
  EXPECT_STREQ(dtype_name(DType::kBool), "BOOL");
  EXPECT_EQ(dtype_size(DType::kF64), 8u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kBool), 1u);
  EXPECT_EQ(dtype_from_name("I16"), DType::kI16);
  EXPECT_EQ(dtype_from_name("f32"), std::nullopt);
  EXPECT_EQ(dtype_from_name("F8_E4M3"), std::nullopt);
}

TEST_F(SafetensorsTest, KeepsGivenOrderNotSortedByName) {
  float z[1] = {1}, a[2] = {2, 3}, m[3] = {4, 5, 6};
  const std::string path = PathOf("order.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"z", DType::kF32, {1}, z, sizeof(z)},
                                      {"a", DType::kF32, {2}, a, sizeof(a)},
                                      {"m", DType::kF32, {3}, m, sizeof(m)}})
                  .ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  ASSERT_EQ((*file)->tensors().size(), 3u);
  EXPECT_EQ((*file)->tensors()[0].name, "z");
  EXPECT_EQ((*file)->tensors()[1].name, "a");
  EXPECT_EQ((*file)->tensors()[2].name, "m");
  float m_read[3];
  std::memcpy(m_read, (*file)->Find("m")->data, sizeof(m_read));
  EXPECT_EQ(m_read[2], 6.0f);
  EXPECT_EQ((*file)->Find("absent"), nullptr);
}

TEST_F(SafetensorsTest, MetadataRoundTrip) {
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"trainerd.step", "1200"}, {"note", "quote \" and unicode \xc3\xa9"}};
  int32_t x[2] = {1, 2};
  const std::string path = PathOf("meta.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"x", DType::kI32, {2}, x, sizeof(x)}}, metadata).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ((*file)->metadata(), metadata);
}

TEST_F(SafetensorsTest, NoMetadataGivesEmptyMapAndNoMetadataKey) {
  int8_t x[1] = {5};
  const std::string path = PathOf("nometa.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"x", DType::kI8, {1}, x, 1}}).ok());
  EXPECT_EQ(ReadAll(path).find("__metadata__"), std::string::npos);
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_TRUE((*file)->metadata().empty());
}

TEST_F(SafetensorsTest, EmptyTensorAndScalar) {
  double scalar = 2.5;
  const std::string path = PathOf("empty.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"empty", DType::kF32, {0, 4}, nullptr, 0},
                                      {"scalar", DType::kF64, {}, &scalar, sizeof(scalar)},
                                      {"empty_too", DType::kU8, {3, 0}, nullptr, 0}})
                  .ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  const TensorView* empty = (*file)->Find("empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->nbytes, 0u);
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_EQ(empty->shape, (std::vector<int64_t>{0, 4}));
  const TensorView* s = (*file)->Find("scalar");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->numel(), 1);
  double read;
  std::memcpy(&read, s->data, sizeof(read));
  EXPECT_EQ(read, 2.5);
  ASSERT_NE((*file)->Find("empty_too"), nullptr);
}

TEST_F(SafetensorsTest, FileWithoutTensors) {
  const std::string path = PathOf("none.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_TRUE((*file)->tensors().empty());
}

TEST_F(SafetensorsTest, HeaderPaddedWithSpacesToMultipleOf8) {
  uint8_t x[3] = {1, 2, 3};
  const std::string path = PathOf("pad.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"abc", DType::kU8, {3}, x, 3}}).ok());
  const std::string bytes = ReadAll(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 3);
  const std::string header = bytes.substr(8, n);
  const size_t close = header.find_last_of('}');
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(header.substr(close + 1), std::string(n - close - 1, ' '));
  EXPECT_EQ(bytes.substr(8 + n), "\x01\x02\x03");
}

// The bytes huggingface/safetensors writes for {"w": float32[2]} with
// metadata {"format": "pt"}: compact JSON, metadata first, space padding.
TEST_F(SafetensorsTest, MatchesReferenceLayoutByteForByte) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  const float w[2] = {1.0f, -2.0f};
  std::string buffer(reinterpret_cast<const char*>(w), sizeof(w));
  const std::string reference_path = WriteCrafted(padded, buffer);

  auto file = SafetensorsFile::Open(reference_path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");

  const std::string ours = PathOf("ours.safetensors");
  ASSERT_TRUE(
      WriteSafetensors(ours, {{"w", DType::kF32, {2}, w, sizeof(w)}}, {{"format", "pt"}}).ok());
  EXPECT_EQ(ReadAll(ours), ReadAll(reference_path));
}

TEST_F(SafetensorsTest, AtomicWriteReplacesExistingFileAndLeavesNoTemporary) {
  const std::string path = WriteBytes("model.safetensors", "old contents, not safetensors");
  int64_t v[1] = {42};
  ASSERT_TRUE(WriteSafetensors(path, {{"v", DType::kI64, {1}, v, sizeof(v)}}).ok());
  EXPECT_EQ(FolderEntries(dir_.path()), std::vector<std::string>{"model.safetensors"});
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  int64_t read;
  std::memcpy(&read, (*file)->Find("v")->data, sizeof(read));
  EXPECT_EQ(read, 42);
}

TEST_F(SafetensorsTest, OpenViewsSurviveReplacingTheFile) {
  const std::string path = PathOf("swap.safetensors");
  int16_t first[2] = {1, 2}, second[2] = {3, 4};
  ASSERT_TRUE(WriteSafetensors(path, {{"x", DType::kI16, {2}, first, sizeof(first)}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  ASSERT_TRUE(WriteSafetensors(path, {{"x", DType::kI16, {2}, second, sizeof(second)}}).ok());
  int16_t read[2];
  std::memcpy(read, (*file)->Find("x")->data, sizeof(read));
  EXPECT_EQ(read[1], 2);  // rename left the old inode, and our mapping, intact
}

TEST_F(SafetensorsTest, WriteIntoMissingFolderFails) {
  const std::string path = PathOf("no/such/folder/x.safetensors");
  uint8_t x[1] = {0};
  ExpectErrorContains(WriteSafetensors(path, {{"x", DType::kU8, {1}, x, 1}}),
                      {path, "does the folder exist"});
  EXPECT_TRUE(FolderEntries(dir_.path()).empty());
}

TEST_F(SafetensorsTest, WriteRejectsDuplicateNames) {
  uint8_t x[1] = {0};
  const std::string path = PathOf("dup.safetensors");
  ExpectErrorContains(
      WriteSafetensors(path, {{"x", DType::kU8, {1}, x, 1}, {"x", DType::kU8, {1}, x, 1}}),
      {path, "'x'", "twice"});
  EXPECT_TRUE(FolderEntries(dir_.path()).empty());
}

TEST_F(SafetensorsTest, WriteRejectsNbytesNotMatchingShape) {
  float x[3] = {0, 0, 0};
  const std::string path = PathOf("bad.safetensors");
  ExpectErrorContains(WriteSafetensors(path, {{"w", DType::kF32, {2, 2}, x, sizeof(x)}}),
                      {path, "'w'", "nbytes 12", "need 16"});
  EXPECT_TRUE(FolderEntries(dir_.path()).empty());
}

TEST_F(SafetensorsTest, WriteRejectsReservedAndEmptyNamesAndNegativeDims) {
  uint8_t x[1] = {0};
  const std::string path = PathOf("bad.safetensors");
  ExpectErrorContains(WriteSafetensors(path, {{"__metadata__", DType::kU8, {1}, x, 1}}),
                      {"reserved"});
  ExpectErrorContains(WriteSafetensors(path, {{"", DType::kU8, {1}, x, 1}}), {"empty name"});
  ExpectErrorContains(WriteSafetensors(path, {{"n", DType::kU8, {-1}, x, 1}}), {"'n'", "negative"});
  ExpectErrorContains(WriteSafetensors(path, {{"p", DType::kU8, {1}, nullptr, 1}}),
                      {"'p'", "nullptr"});
  EXPECT_TRUE(FolderEntries(dir_.path()).empty());
}

// ---- malformed files ------------------------------------------------------

TEST_F(SafetensorsTest, MissingFile) {
  const std::string path = PathOf("absent.safetensors");
  ExpectErrorContains(OpenStatus(path), {path, "no such file"});
}

TEST_F(SafetensorsTest, PathIsADirectory) {
  ExpectErrorContains(OpenStatus(dir_.path()), {dir_.path(), "is a directory"});
}

TEST_F(SafetensorsTest, FileShorterThanEightBytes) {
  const std::string path = WriteBytes("short.safetensors", std::string("\x05\x00\x00", 3));
  ExpectErrorContains(OpenStatus(path), {path, "3 bytes", "shorter than the 8-byte header length"});
}

TEST_F(SafetensorsTest, EmptyFile) {
  const std::string path = WriteBytes("zero.safetensors", "");
  ExpectErrorContains(OpenStatus(path), {path, "0 bytes"});
}

TEST_F(SafetensorsTest, HeaderLengthLargerThanFile) {
  const std::string path = WriteCrafted("{}", "", /*header_length=*/1000);
  ExpectErrorContains(OpenStatus(path), {path, "header length 1000", "truncated"});
}

TEST_F(SafetensorsTest, HeaderLengthAbsurd) {
  const std::string path = WriteCrafted("{}", "", /*header_length=*/int64_t{1} << 40);
  ExpectErrorContains(OpenStatus(path), {path, "100 MB"});
}

TEST_F(SafetensorsTest, HeaderNotValidJson) {
  const std::string path = WriteCrafted(R"({"a": {"dtype": )", "");
  ExpectErrorContains(OpenStatus(path), {path, "not valid JSON", "byte offset"});
}

TEST_F(SafetensorsTest, HeaderNotAnObject) {
  const std::string path = WriteCrafted("[1, 2, 3]", "");
  ExpectErrorContains(OpenStatus(path), {path, "array", "expected an object"});
}

TEST_F(SafetensorsTest, TensorEntryNotAnObject) {
  const std::string path = WriteCrafted(R"({"w": 3})", "");
  ExpectErrorContains(OpenStatus(path), {path, "'w'", "expected an object"});
}

TEST_F(SafetensorsTest, UnknownDType) {
  const std::string path =
      WriteCrafted(R"({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", "ab");
  ExpectErrorContains(OpenStatus(path), {path, "'w'", "F8_E4M3", "supported: F32"});
}

TEST_F(SafetensorsTest, DTypeMissing) {
  const std::string path = WriteCrafted(R"({"w": {"shape": [2], "data_offsets": [0, 2]}})", "ab");
  ExpectErrorContains(OpenStatus(path), {path, "'w'", "\"dtype\""});
}

TEST_F(SafetensorsTest, ShapeWithNegativeDimension) {
  const std::string path =
      WriteCrafted(R"({"w": {"dtype": "U8", "shape": [2, -1], "data_offsets": [0, 2]}})", "ab");
  ExpectErrorContains(OpenStatus(path), {path, "'w'", "\"shape\"", "non-negative", "dimension 1"});
}

TEST_F(SafetensorsTest, ShapeNotAList) {
  const std::string path =
      WriteCrafted(R"({"w": {"dtype": "U8", "shape": "2", "data_offsets": [0, 2]}})", "ab");
  ExpectErrorContains(OpenStatus(path), {path, "'w'", "\"shape\""});
}

TEST_F(SafetensorsTest, ShapeWithNonIntegerDimension) {
  const std::string path =
      WriteCrafted(R"({"w": {"dtype": "U8", "shape": [2.5], "data_offsets": [0, 2]}})", "ab");
  ExpectErrorContains(OpenStatus(path), {path, "'w'", "\"shape\""});
}

TEST_F(SafetensorsTest, DataOffsetsNotTwoIntegers) {
  const std::string path =
      WriteCrafted(R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 1, 2]}})", "ab");
  ExpectErrorContains(OpenStatus(path),
                      {path, "'w'", "\"data_offsets\"", "two non-negative integers"});
}

TEST_F(SafetensorsTest, DataOffsetsMissing) {
  const std::string path = WriteCrafted(R"({"w": {"dtype": "U8", "shape": [2]}})", "ab");
  ExpectErrorContains(OpenStatus(path), {path, "'w'", "\"data_offsets\" is missing"});
}

TEST_F(SafetensorsTest, DataOffsetsBeginAfterEnd) {
  const std::string path =
      WriteCrafted(R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [2, 0]}})", "ab");
  ExpectErrorContains(OpenStatus(path), {path, "'w'", "begin > end"});
}

TEST_F(SafetensorsTest, TruncatedDataBuffer) {
  const std::string path =
      WriteCrafted(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", "12345678");
  ExpectErrorContains(OpenStatus(path), {path, "'w'", "holds 8 bytes", "truncated"});
}

TEST_F(SafetensorsTest, HeaderLiesAboutTensorSize) {
  const std::string path =
      WriteCrafted(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", "1234");
  ExpectErrorContains(OpenStatus(path), {path, "'w'", "span 4 bytes", "needs 8"});
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  const std::string path =
      WriteCrafted(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
                   R"( "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}})",
                   "123456");
  ExpectErrorContains(OpenStatus(path), {path, "'b'", "overlap tensor 'a'"});
}

TEST_F(SafetensorsTest, HoleBetweenTensors) {
  const std::string path =
      WriteCrafted(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},)"
                   R"( "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}})",
                   "123456");
  ExpectErrorContains(OpenStatus(path), {path, "'b'", "hole", "bytes [2, 4)"});
}

TEST_F(SafetensorsTest, HoleAtStartOfBuffer) {
  const std::string path =
      WriteCrafted(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})", "1234");
  ExpectErrorContains(OpenStatus(path), {path, "'a'", "hole", "bytes [0, 2)"});
}

TEST_F(SafetensorsTest, TrailingBytesAfterLastTensor) {
  const std::string path =
      WriteCrafted(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", "1234");
  ExpectErrorContains(OpenStatus(path), {path, "2 trailing bytes"});
}

TEST_F(SafetensorsTest, DuplicateTensorNameInHeader) {
  const std::string path =
      WriteCrafted(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},)"
                   R"( "a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})",
                   "1234");
  ExpectErrorContains(OpenStatus(path), {path, "'a' twice"});
}

TEST_F(SafetensorsTest, MetadataValueNotAString) {
  const std::string path = WriteCrafted(R"({"__metadata__": {"step": 12}})", "");
  ExpectErrorContains(OpenStatus(path), {path, "__metadata__", "'step'", "expected a string"});
}

TEST_F(SafetensorsTest, TensorsSortedByOffsetWhatEverTheHeaderOrder) {
  const std::string path =
      WriteCrafted(R"({"second": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]},)"
                   R"( "first": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})",
                   "abcd");
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  ASSERT_EQ((*file)->tensors().size(), 2u);
  EXPECT_EQ((*file)->tensors()[0].name, "first");
  EXPECT_EQ(std::string(static_cast<const char*>((*file)->tensors()[1].data), 2), "cd");
}

}  // namespace
}  // namespace trainerd::engine
