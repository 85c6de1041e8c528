// Pieces of the tokenizer against HF semantics: split behaviours, the
// Oniguruma-compatible regex, lossy UTF-8, byte-level table.
#include <gtest/gtest.h>

#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/split_pattern.h"
#include "engine/tokenizer/utf8.h"

namespace trainerd::engine::tokenizer {
namespace {

std::vector<std::string> Split(const std::string& text, SplitBehavior behavior, bool invert = false) {
  SplitPattern pattern = SplitPattern::Literal("-");
  std::vector<PatternPiece> pieces;
  EXPECT_TRUE(pattern.FindPieces(text, invert, &pieces).ok());
  std::vector<std::pair<size_t, size_t>> kept;
  ApplySplitBehavior(pieces, behavior, &kept);
  std::vector<std::string> out;
  for (auto [s, e] : kept)
    if (s != e) out.push_back(text.substr(s, e - s));
  return out;
}

// The examples of HF's SplitDelimiterBehavior documentation.
TEST(SplitPatternTest, BehavioursMatchHfDocumentation) {
  const std::string text = "the-final--countdown";
  using V = std::vector<std::string>;
  EXPECT_EQ(Split(text, SplitBehavior::kRemoved), (V{"the", "final", "countdown"}));
  EXPECT_EQ(Split(text, SplitBehavior::kIsolated), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(Split(text, SplitBehavior::kMergedWithPrevious), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(Split(text, SplitBehavior::kMergedWithNext), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(Split(text, SplitBehavior::kContiguous), (V{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(Split(text, SplitBehavior::kRemoved, /*invert=*/true), (V{"-", "-", "-"}));
}

TEST(RegexTest, WhiteSpaceIsUnicodeWhiteSpace) {
  auto regex = Regex::Compile(R"(\s+)");
  ASSERT_TRUE(regex.ok());
  std::vector<std::pair<size_t, size_t>> matches;
  // U+0085 (NEL) is white space for Oniguruma though not for PCRE2's \s.
  ASSERT_TRUE((*regex)->FindAll("a\xC2\x85\xE3\x80\x80" "b", &matches).ok());
  ASSERT_EQ(matches.size(), 1u);
  EXPECT_EQ(matches[0], (std::pair<size_t, size_t>{1, 6}));
}

TEST(Utf8Test, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(Utf8Lossy("a\xF0\x9F\x99" "b"), "a\xEF\xBF\xBD" "b");  // truncated 4-byte: one U+FFFD
  EXPECT_EQ(Utf8Lossy("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(FindInvalidUtf8("ok \xC0\xAF"), 3u);  // overlong
}

TEST(ByteLevelTest, Gpt2Table) {
  EXPECT_EQ(ByteLevelChar(' '), "Ġ");
  EXPECT_EQ(ByteLevelChar('\n'), "Ċ");
  EXPECT_EQ(ByteLevelChar('a'), "a");
  EXPECT_EQ(ByteLevelChar(0xAD), "Ń");
  EXPECT_EQ(ByteLevelByte(U'Ġ'), ' ');
  EXPECT_EQ(ByteLevelByte(U'€'), -1);
}

}  // namespace
}  // namespace trainerd::engine::tokenizer
