#include "engine/durable_files.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
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

// Names in `folder`, sorted.
std::vector<std::string> FolderEntries(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

using Names = std::vector<std::string>;

class DurableFilesTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed"; }
  std::string PathOf(const std::string& name) const { return dir_.path() + "/" + name; }

  TempDir dir_;
};

TEST_F(DurableFilesTest, WriteFileAtomicallyCreatesTheFile) {
  const std::string path = PathOf("state.json");
  ASSERT_TRUE(WriteFileAtomically(path, "{\"step\": 3}\n").ok());
  EXPECT_EQ(ReadAll(path), "{\"step\": 3}\n");
  EXPECT_EQ(FolderEntries(dir_.path()), (Names{"state.json"}));
}

TEST_F(DurableFilesTest, WriteFileAtomicallyReplacesContentAndLeavesNoTempFile) {
  const std::string path = PathOf("metrics.json");
  WriteText(path, "a much longer old content that must not survive as a tail\n");
  Status s = WriteFileAtomically(path, "new\n");
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadAll(path), "new\n");
  EXPECT_EQ(FolderEntries(dir_.path()), (Names{"metrics.json"}));
}

TEST_F(DurableFilesTest, WriteFileAtomicallyWritesEmptyAndBinaryContent) {
  const std::string path = PathOf("blob");
  const std::string binary("a\0b\xff", 4);
  ASSERT_TRUE(WriteFileAtomically(path, binary).ok());
  EXPECT_EQ(ReadAll(path), binary);
  ASSERT_TRUE(WriteFileAtomically(path, "").ok());
  EXPECT_TRUE(fs::exists(path));
  EXPECT_EQ(fs::file_size(path), 0u);
}

TEST_F(DurableFilesTest, WriteFileAtomicallyMakesAReadableFile) {
  // mkstemp creates 0600; the result must be readable like any other output.
  const std::string path = PathOf("adapter_config.json");
  ASSERT_TRUE(WriteFileAtomically(path, "{}").ok());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
}

TEST_F(DurableFilesTest, WriteFileAtomicallyIntoMissingFolderFails) {
  const std::string path = PathOf("no-such-folder/file.json");
  ExpectErrorContains(WriteFileAtomically(path, "x"), {path});
  EXPECT_FALSE(fs::exists(PathOf("no-such-folder")));
}

TEST_F(DurableFilesTest, MakeStagingDirectoryCreatesAHiddenFolderInANewParent) {
  const std::string parent = PathOf("out/checkpoints");
  auto staging = MakeStagingDirectory(parent, "checkpoint-5");
  ASSERT_TRUE(staging.ok()) << staging.status().message();
  EXPECT_TRUE(fs::is_directory(*staging));
  EXPECT_EQ(fs::path(*staging).parent_path(), fs::path(parent));
  const std::string name = fs::path(*staging).filename();
  EXPECT_EQ(name.rfind(".checkpoint-5.tmp-", 0), 0u) << name;
  EXPECT_TRUE(fs::is_empty(*staging));
}

TEST_F(DurableFilesTest, MakeStagingDirectoryGivesDistinctFolders) {
  auto a = MakeStagingDirectory(dir_.path(), "adapter");
  auto b = MakeStagingDirectory(dir_.path(), "adapter");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_TRUE(fs::is_directory(*a));
  EXPECT_TRUE(fs::is_directory(*b));
}

TEST_F(DurableFilesTest, MakeStagingDirectoryUnderAFileFails) {
  WriteText(PathOf("plain-file"), "x");
  auto staging = MakeStagingDirectory(PathOf("plain-file"), "adapter");
  ExpectErrorContains(staging.status(), {PathOf("plain-file")});
}

TEST_F(DurableFilesTest, CommitDirectoryMovesStagingIntoPlace) {
  const std::string final_path = PathOf("out/adapter");
  auto staging = MakeStagingDirectory(PathOf("out"), "adapter");
  ASSERT_TRUE(staging.ok()) << staging.status().message();
  WriteText(*staging + "/adapter_config.json", "{\"r\": 4}");
  WriteText(*staging + "/adapter_model.safetensors", "weights");

  Status s = CommitDirectory(*staging, final_path);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_FALSE(fs::exists(*staging));
  EXPECT_EQ(FolderEntries(PathOf("out")), (Names{"adapter"}));
  EXPECT_EQ(FolderEntries(final_path), (Names{"adapter_config.json", "adapter_model.safetensors"}));
  EXPECT_EQ(ReadAll(final_path + "/adapter_config.json"), "{\"r\": 4}");
}

TEST_F(DurableFilesTest, CommitDirectoryReplacesAnExistingFolder) {
  const std::string final_path = PathOf("out/adapter");
  fs::create_directories(final_path + "/nested");
  WriteText(final_path + "/adapter_config.json", "old config");
  WriteText(final_path + "/stale.bin", "from the previous run");
  WriteText(final_path + "/nested/deep.txt", "old");

  auto staging = MakeStagingDirectory(PathOf("out"), "adapter");
  ASSERT_TRUE(staging.ok()) << staging.status().message();
  WriteText(*staging + "/adapter_config.json", "new config");

  Status s = CommitDirectory(*staging, final_path);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(FolderEntries(final_path), (Names{"adapter_config.json"}));
  EXPECT_EQ(ReadAll(final_path + "/adapter_config.json"), "new config");
  // Neither the staging folder nor the moved-aside old one (*.old) remains.
  EXPECT_EQ(FolderEntries(PathOf("out")), (Names{"adapter"}));
}

TEST_F(DurableFilesTest, CommitDirectoryWithMissingStagingFailsAndKeepsTheOldFolder) {
  const std::string final_path = PathOf("adapter");
  fs::create_directories(final_path);
  WriteText(final_path + "/adapter_config.json", "old config");
  const std::string staging = PathOf(".adapter.tmp-missing");

  ExpectErrorContains(CommitDirectory(staging, final_path), {staging});
  EXPECT_EQ(ReadAll(final_path + "/adapter_config.json"), "old config");
  EXPECT_EQ(FolderEntries(dir_.path()), (Names{"adapter"}));
}

}  // namespace
}  // namespace trainerd::engine
