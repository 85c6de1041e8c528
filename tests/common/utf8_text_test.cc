// ValidUtf8 / Utf8Prefix: what may go into a protobuf string field.
#include "common/utf8_text.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace trainerd {
namespace {

const std::string kReplacement = "\xEF\xBF\xBD";

TEST(Utf8TextTest, ValidTextIsUnchanged) {
  for (const std::string& text : std::vector<std::string>{"", "plain ascii", "caf\xC3\xA9", "\xE2\x82\xAC 5", "\xF0\x9F\x98\x80 emoji",
                                 "\xE4\xB8\xAD\xE6\x96\x87", std::string("nul\0byte", 8)}) {
    EXPECT_EQ(ValidUtf8(text), text);
  }
}

TEST(Utf8TextTest, EachInvalidByteBecomesOneReplacementCharacter) {
  EXPECT_EQ(ValidUtf8("a\xFFz"), "a" + kReplacement + "z");
  EXPECT_EQ(ValidUtf8("\xC3"), kReplacement);                                  // truncated at the end
  EXPECT_EQ(ValidUtf8("\xC3(x"), kReplacement + "(x");                          // bad continuation
  EXPECT_EQ(ValidUtf8("\xC0\xAF"), kReplacement + kReplacement);                // overlong '/'
  EXPECT_EQ(ValidUtf8("\xED\xA0\x80"), kReplacement + kReplacement + kReplacement);  // a surrogate
  EXPECT_EQ(ValidUtf8("\xF4\x90\x80\x80"), kReplacement + kReplacement + kReplacement + kReplacement);  // > U+10FFFF
  EXPECT_EQ(ValidUtf8("\x80ok"), kReplacement + "ok");                          // a lone continuation byte
}

TEST(Utf8TextTest, PrefixNeverSplitsACharacter) {
  const std::string text = "ab\xE2\x82\xAC" "cd";  // a, b, the euro sign (3 bytes), c, d
  EXPECT_EQ(Utf8Prefix(text, 100), text);
  EXPECT_EQ(Utf8Prefix(text, 5), "ab\xE2\x82\xAC");
  EXPECT_EQ(Utf8Prefix(text, 4), "ab");
  EXPECT_EQ(Utf8Prefix(text, 3), "ab");
  EXPECT_EQ(Utf8Prefix(text, 2), "ab");
  EXPECT_EQ(Utf8Prefix(text, 0), "");
}

}  // namespace
}  // namespace trainerd
