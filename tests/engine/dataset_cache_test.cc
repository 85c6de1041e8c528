#include "engine/dataset_cache.h"
#include "engine/sha256.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace trainerd::engine {
namespace {

namespace fs = std::filesystem;

using trainerd::testing::TempDir;

const std::string kKey = "4f2a9c0e7d1b3a5c6e8f0a2b4c6d8e0f1a3b5c7d9e1f3a5b7c9d1e3f5a7b9c1d";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Recomputes the trailing checksum, as a hostile writer would.
void Reseal(std::string& file) {
  Sha256 hash;
  hash.Update(std::string_view(file).substr(0, file.size() - 32));
  const auto digest = hash.Digest();
  file.replace(file.size() - 32, 32, reinterpret_cast<const char*>(digest.data()), 32);
}

void PutU64At(std::string& file, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) file[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

TokenDataset Sample() {
  TokenDataset data;
  data.lines = 7;
  data.truncated = 2;
  data.dropped = 1;
  data.examples.push_back({{1, 2, 3, 4}, {1, 2, 3, 4}, {}});
  data.examples.push_back({{10, 20, 30, 40, 50}, {-100, -100, -100, 40, 50}, {}});  // prompt masked
  data.examples.push_back({{0, 2147483647}, {0, 2147483647}, {}});                 // int32 extremes
  TokenExample long_one;
  for (int i = 0; i < 1000; ++i) {
    long_one.input_ids.push_back(i * 37 % 151936);
    long_one.labels.push_back(i % 5 == 0 ? kIgnoreIndex : i * 37 % 151936);
  }
  data.examples.push_back(long_one);
  return data;
}

void ExpectSame(const TokenDataset& got, const TokenDataset& want) {
  EXPECT_EQ(got.lines, want.lines);
  EXPECT_EQ(got.truncated, want.truncated);
  EXPECT_EQ(got.dropped, want.dropped);
  ASSERT_EQ(got.examples.size(), want.examples.size());
  for (size_t i = 0; i < want.examples.size(); ++i) {
    EXPECT_EQ(got.examples[i].input_ids, want.examples[i].input_ids) << "example " << i;
    EXPECT_EQ(got.examples[i].labels, want.examples[i].labels) << "example " << i;
    EXPECT_TRUE(got.examples[i].position_ids.empty()) << "example " << i;
  }
}

class DatasetCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed";
    path_ = dir_ / "cache/train.tokcache";
    fs::create_directories(fs::path(path_).parent_path());
  }

  // Writes Sample() and returns the file's bytes.
  std::string WriteSample() {
    Status st = WriteDatasetCache(path_, kKey, Sample());
    EXPECT_TRUE(st.ok()) << st.message();
    return ReadAll(path_);
  }

  // Reads path_ with kKey, expecting nullopt; returns the reason.
  std::string ExpectMiss() {
    std::string why = "unset";
    EXPECT_FALSE(ReadDatasetCache(path_, kKey, &why).has_value());
    EXPECT_NE(why, "unset");
    EXPECT_FALSE(why.empty());
    return why;
  }

  TempDir dir_;
  std::string path_;
};

TEST_F(DatasetCacheTest, RoundTripIsExact) {
  path_ = dir_ / "new/folder/train.tokcache";  // WriteDatasetCache creates the folders
  WriteSample();
  std::string why;
  const auto got = ReadDatasetCache(path_, kKey, &why);
  ASSERT_TRUE(got.has_value()) << why;
  ExpectSame(*got, Sample());
}

TEST_F(DatasetCacheTest, EmptyDatasetRoundTrips) {
  TokenDataset empty;
  empty.lines = 3;
  empty.dropped = 3;
  ASSERT_TRUE(WriteDatasetCache(path_, kKey, empty).ok());
  const auto got = ReadDatasetCache(path_, kKey, nullptr);
  ASSERT_TRUE(got.has_value());
  ExpectSame(*got, empty);
}

TEST_F(DatasetCacheTest, OverwriteReplacesAndLeavesNoTemporaryFile) {
  WriteSample();
  TokenDataset other = Sample();
  other.examples.pop_back();
  other.lines = 99;
  ASSERT_TRUE(WriteDatasetCache(path_, kKey, other).ok());
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(fs::path(path_).parent_path())) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"train.tokcache"});
  const auto got = ReadDatasetCache(path_, kKey, nullptr);
  ASSERT_TRUE(got.has_value());
  ExpectSame(*got, other);
}

TEST_F(DatasetCacheTest, WrongKeyIsAMiss) {
  WriteSample();
  std::string why;
  EXPECT_FALSE(ReadDatasetCache(path_, "0" + kKey.substr(1), &why).has_value());
  EXPECT_EQ(why, "written for another key");
  EXPECT_FALSE(ReadDatasetCache(path_, kKey.substr(1), &why).has_value());
  EXPECT_EQ(why, "written for another key");
}

TEST_F(DatasetCacheTest, MissingFileIsAMiss) { EXPECT_EQ(ExpectMiss(), "no cache file"); }

TEST_F(DatasetCacheTest, EveryTruncationIsAMiss) {
  const std::string whole = WriteSample();
  ASSERT_GT(whole.size(), 8000u);
  // Shrinks the file in place (rewriting it each time is slow on ext4, which
  // flushes a file rewritten after truncation to 0).
  for (size_t n = whole.size(); n-- > 0;) {
    ASSERT_EQ(::truncate(path_.c_str(), static_cast<off_t>(n)), 0);
    std::string why;
    ASSERT_FALSE(ReadDatasetCache(path_, kKey, &why).has_value()) << "truncated to " << n << " bytes";
    ASSERT_EQ(why.rfind("damaged: ", 0), 0u) << "truncated to " << n << " bytes: " << why;
  }
}

TEST_F(DatasetCacheTest, FlippedBodyByteIsDamaged) {
  std::string file = WriteSample();
  for (size_t at : {file.size() / 2, file.size() - 40, file.size() - 1}) {
    std::string bad = file;
    bad[at] ^= 0x10;
    WriteBytes(path_, bad);
    EXPECT_EQ(ExpectMiss(), "damaged: checksum mismatch") << "byte " << at;
  }
}

TEST_F(DatasetCacheTest, GarbageIsAMiss) {
  WriteBytes(path_, std::string(4096, '\xff'));
  EXPECT_EQ(ExpectMiss(), "not a dataset cache file");
}

// A resealed file (valid checksum) whose lengths lie: refused before any allocation.
TEST_F(DatasetCacheTest, HugeLengthsAreRefusedWithoutAllocating) {
  const std::string file = WriteSample();
  const size_t count_at = 16 + kKey.size() + 24;
  for (uint64_t huge : {uint64_t{1} << 62, ~uint64_t{0}, uint64_t{100000}}) {
    std::string bad = file;
    PutU64At(bad, count_at, huge);  // number of examples
    Reseal(bad);
    WriteBytes(path_, bad);
    EXPECT_NE(ExpectMiss().find("cannot fit"), std::string::npos) << huge;

    bad = file;
    PutU64At(bad, count_at + 8, huge);  // first example's token count
    Reseal(bad);
    WriteBytes(path_, bad);
    EXPECT_NE(ExpectMiss().find("runs past the end"), std::string::npos) << huge;
  }
  // A key length beyond the limit.
  std::string bad = file;
  bad[14] = 0x7f;
  WriteBytes(path_, bad);
  EXPECT_EQ(ExpectMiss().rfind("damaged: key length", 0), 0u);
}

TEST_F(DatasetCacheTest, HostileValuesAreRefused) {
  const std::string file = WriteSample();
  const size_t first_id_at = 16 + kKey.size() + 40;
  std::string bad = file;
  bad[first_id_at + 3] = '\x80';  // input_ids[0] < 0
  Reseal(bad);
  WriteBytes(path_, bad);
  EXPECT_NE(ExpectMiss().find("has an id < 0"), std::string::npos);

  bad = file;
  bad[16 + kKey.size() + 7] = '\x80';  // lines < 0
  Reseal(bad);
  WriteBytes(path_, bad);
  EXPECT_NE(ExpectMiss().find("negative"), std::string::npos);
}

TEST_F(DatasetCacheTest, OtherVersionIsAMiss) {
  std::string file = WriteSample();
  file[8] = static_cast<char>(kDatasetCacheVersion - 1);
  Reseal(file);
  WriteBytes(path_, file);
  EXPECT_EQ(ExpectMiss(), "format version " + std::to_string(kDatasetCacheVersion - 1) + ", want " +
                              std::to_string(kDatasetCacheVersion));
}

TEST_F(DatasetCacheTest, WriteRefusesWhatItCannotStore) {
  TokenDataset data = Sample();
  data.examples[0].input_ids[1] = int64_t{1} << 31;
  EXPECT_FALSE(WriteDatasetCache(path_, kKey, data).ok());
  data = Sample();
  data.examples[1].labels.pop_back();
  EXPECT_FALSE(WriteDatasetCache(path_, kKey, data).ok());
  data = Sample();
  data.examples[0].position_ids = {0, 1, 2, 3};
  EXPECT_FALSE(WriteDatasetCache(path_, kKey, data).ok());
  EXPECT_FALSE(fs::exists(path_));
}

}  // namespace
}  // namespace trainerd::engine
