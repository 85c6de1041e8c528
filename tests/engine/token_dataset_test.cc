#include "engine/token_dataset.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

namespace trainerd::engine {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 256;
constexpr int64_t kMaxSeqLen = 2048;

using trainerd::testing::ExpectErrorContains;
using trainerd::testing::TempDir;

class TokenDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed"; }

  // Writes `text` to data.jsonl in the temp folder and returns its path.
  std::string Write(const std::string& text) {
    const std::string path = dir_.path() + "/data.jsonl";
    std::ofstream out(path, std::ios::binary);
    out << text;
    return path;
  }

  StatusOr<TokenDataset> Load(const std::string& text, int64_t max_seq_len = kMaxSeqLen) {
    path_ = Write(text);
    return LoadTokenDataset(path_, kVocab, max_seq_len);
  }

  // "<path>:<line>", as errors name a line.
  std::string At(int line) const { return path_ + ":" + std::to_string(line); }

  TempDir dir_;
  std::string path_;
};

using Ids = std::vector<int64_t>;

TEST_F(TokenDatasetTest, ReadsExamplesWithAndWithoutLabels) {
  auto data = Load(
      "{\"input_ids\": [1, 2, 3, 4]}\n"
      "{\"input_ids\": [5, 6, 7], \"labels\": [-100, 6, 7]}\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  ASSERT_EQ(data->examples.size(), 2u);
  EXPECT_EQ(data->examples[0].input_ids, (Ids{1, 2, 3, 4}));
  EXPECT_EQ(data->examples[1].input_ids, (Ids{5, 6, 7}));
  EXPECT_EQ(data->examples[1].labels, (Ids{-100, 6, 7}));
  EXPECT_EQ(data->lines, 2);
  EXPECT_EQ(data->truncated, 0);
  EXPECT_EQ(data->dropped, 0);
}

TEST_F(TokenDatasetTest, LabelsDefaultToInputIds) {
  auto data = Load("{\"input_ids\": [10, 20, 30]}\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  ASSERT_EQ(data->examples.size(), 1u);
  EXPECT_EQ(data->examples[0].labels, (Ids{10, 20, 30}));
  // The first label is never a target: 3 tokens give 2 targets.
  EXPECT_EQ(data->examples[0].target_tokens(), 2);
}

TEST_F(TokenDatasetTest, LastLineWithoutNewlineIsRead) {
  auto data = Load("{\"input_ids\": [1, 2]}\n{\"input_ids\": [3, 4]}");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->examples.size(), 2u);
}

TEST_F(TokenDatasetTest, LongExamplesAreTruncatedAndCounted) {
  auto data = Load(
      "{\"input_ids\": [1, 2, 3, 4, 5, 6], \"labels\": [-100, 2, 3, 4, 5, 6]}\n"
      "{\"input_ids\": [7, 8, 9, 10]}\n"
      "{\"input_ids\": [11, 12]}\n",
      /*max_seq_len=*/4);
  ASSERT_TRUE(data.ok()) << data.status().message();
  ASSERT_EQ(data->examples.size(), 3u);
  EXPECT_EQ(data->truncated, 1);
  EXPECT_EQ(data->examples[0].input_ids, (Ids{1, 2, 3, 4}));
  EXPECT_EQ(data->examples[0].labels, (Ids{-100, 2, 3, 4}));
  EXPECT_EQ(data->examples[1].input_ids, (Ids{7, 8, 9, 10}));  // exactly max_seq_len: kept whole
  // The longest after truncation, the first of equals; none in an empty set.
  EXPECT_EQ(data->Longest(), &data->examples[0]);
  EXPECT_EQ(TokenDataset{}.Longest(), nullptr);
}

TEST_F(TokenDatasetTest, ExampleWhoseTargetsAreAllTruncatedAwayIsDropped) {
  auto data = Load(
      "{\"input_ids\": [1, 2, 3, 4, 5], \"labels\": [-100, -100, -100, 4, 5]}\n"
      "{\"input_ids\": [6, 7, 8]}\n",
      /*max_seq_len=*/3);
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->truncated, 1);
  EXPECT_EQ(data->dropped, 1);
  ASSERT_EQ(data->examples.size(), 1u);
  EXPECT_EQ(data->examples[0].input_ids, (Ids{6, 7, 8}));
}

TEST_F(TokenDatasetTest, SingleTokenExampleIsDroppedAndCounted) {
  auto data = Load(
      "{\"input_ids\": [42]}\n"
      "{\"input_ids\": [1, 2]}\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->dropped, 1);
  EXPECT_EQ(data->lines, 2);
  ASSERT_EQ(data->examples.size(), 1u);
  EXPECT_EQ(data->examples[0].input_ids, (Ids{1, 2}));
}

TEST_F(TokenDatasetTest, ExampleWithOnlyTheFirstLabelSetIsDropped) {
  // The first label is never predicted, so [7, -100, -100] has nothing to train.
  auto data = Load(
      "{\"input_ids\": [7, 8, 9], \"labels\": [7, -100, -100]}\n"
      "{\"input_ids\": [1, 2], \"labels\": [-100, 2]}\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->dropped, 1);
  ASSERT_EQ(data->examples.size(), 1u);
  EXPECT_EQ(data->examples[0].labels, (Ids{-100, 2}));
}

TEST_F(TokenDatasetTest, BlankLinesAreSkippedButCountTowardLineNumbers) {
  auto data = Load(
      "\n"
      "{\"input_ids\": [1, 2]}\n"
      "   \t\n"
      "\r\n"
      "{\"input_ids\": [3, 4]}\n"
      "\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->examples.size(), 2u);
  EXPECT_EQ(data->lines, 2);

  // A bad line after blank ones is reported by its line number in the file.
  auto bad = Load("\n\n{\"input_ids\": [1, 2]}\n\nnot json\n");
  ExpectErrorContains(bad.status(), {At(5)});
}

TEST_F(TokenDatasetTest, MalformedJsonNamesFileAndLine) {
  auto data = Load("{\"input_ids\": [1, 2]}\n{\"input_ids\": [1, 2\n");
  ExpectErrorContains(data.status(), {At(2), "not valid JSON"});
}

TEST_F(TokenDatasetTest, LineThatIsNotAnObject) {
  auto data = Load("[1, 2, 3]\n");
  ExpectErrorContains(data.status(), {At(1), "JSON object"});
}

TEST_F(TokenDatasetTest, MissingInputIds) {
  auto data = Load("{\"input_ids\": [1, 2]}\n{\"labels\": [1, 2]}\n");
  ExpectErrorContains(data.status(), {At(2), "missing", "input_ids"});
}

TEST_F(TokenDatasetTest, UnknownField) {
  auto data = Load("{\"input_ids\": [1, 2], \"attention_mask\": [1, 1]}\n");
  ExpectErrorContains(data.status(), {At(1), "unknown field", "attention_mask"});
}

TEST_F(TokenDatasetTest, InputIdsNotAList) {
  auto data = Load("{\"input_ids\": \"1 2 3\"}\n");
  ExpectErrorContains(data.status(), {At(1), "input_ids", "list"});
}

TEST_F(TokenDatasetTest, LabelsNotAList) {
  auto data = Load("{\"input_ids\": [1, 2], \"labels\": 5}\n");
  ExpectErrorContains(data.status(), {At(1), "labels", "list"});
}

TEST_F(TokenDatasetTest, NonIntegerId) {
  auto data = Load("{\"input_ids\": [1, 2.5, 3]}\n");
  ExpectErrorContains(data.status(), {At(1), "input_ids[1]", "not an integer"});
}

TEST_F(TokenDatasetTest, StringIdIsNotAnInteger) {
  auto data = Load("{\"input_ids\": [1, \"2\"]}\n");
  ExpectErrorContains(data.status(), {At(1), "input_ids[1]", "not an integer"});
}

TEST_F(TokenDatasetTest, IdAtVocabSizeIsOutOfRange) {
  auto data = Load("{\"input_ids\": [0, 255]}\n{\"input_ids\": [1, 2, 256]}\n");
  ExpectErrorContains(data.status(), {At(2), "input_ids[2]", "256", "vocabulary"});
}

TEST_F(TokenDatasetTest, NegativeIdIsOutOfRange) {
  auto data = Load("{\"input_ids\": [1, -1]}\n");
  ExpectErrorContains(data.status(), {At(1), "input_ids[1]", "-1", "vocabulary"});
}

TEST_F(TokenDatasetTest, IgnoreIndexIsNotAnInputId) {
  auto data = Load("{\"input_ids\": [-100, 2]}\n");
  ExpectErrorContains(data.status(), {At(1), "input_ids[0]", "-100"});
}

TEST_F(TokenDatasetTest, LabelOutOfRange) {
  auto data = Load("{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, 300]}\n");
  ExpectErrorContains(data.status(), {At(1), "labels[2]", "300"});
}

TEST_F(TokenDatasetTest, NegativeLabelOtherThanIgnoreIndexIsOutOfRange) {
  auto data = Load("{\"input_ids\": [1, 2, 3], \"labels\": [-100, -1, 3]}\n");
  ExpectErrorContains(data.status(), {At(1), "labels[1]", "-1"});
}

TEST_F(TokenDatasetTest, IgnoreIndexLabelIsAccepted) {
  auto data = Load("{\"input_ids\": [1, 2, 3], \"labels\": [-100, -100, 3]}\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->examples[0].target_tokens(), 1);
}

TEST_F(TokenDatasetTest, LabelsLengthMismatch) {
  auto data = Load("{\"input_ids\": [1, 2, 3], \"labels\": [1, 2]}\n");
  ExpectErrorContains(data.status(), {At(1), "labels has 2", "input_ids has 3"});
}

TEST_F(TokenDatasetTest, EmptyInputIds) {
  auto data = Load("{\"input_ids\": [1, 2]}\n{\"input_ids\": []}\n");
  ExpectErrorContains(data.status(), {At(2), "input_ids is empty"});
}

TEST_F(TokenDatasetTest, EmptyFile) {
  auto data = Load("");
  ExpectErrorContains(data.status(), {path_, "empty"});
}

TEST_F(TokenDatasetTest, FileOfOnlyBlankLinesIsEmpty) {
  auto data = Load("\n  \n\t\n\n");
  ExpectErrorContains(data.status(), {path_, "empty"});
}

TEST_F(TokenDatasetTest, AllExamplesDropped) {
  auto data = Load("{\"input_ids\": [1]}\n{\"input_ids\": [1, 2], \"labels\": [1, -100]}\n");
  ExpectErrorContains(data.status(), {path_, "all 2 examples", "nothing to train"});
}

TEST_F(TokenDatasetTest, MissingFile) {
  const std::string missing = dir_.path() + "/no-such.jsonl";
  auto data = LoadTokenDataset(missing, kVocab, kMaxSeqLen);
  ExpectErrorContains(data.status(), {missing, "cannot open"});
}

}  // namespace
}  // namespace trainerd::engine
