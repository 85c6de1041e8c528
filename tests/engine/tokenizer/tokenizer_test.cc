// Tokenizer behaviour on hand-written tokenizer.json files (test_tokenizers.h).
// Expected ids are worked out by hand from the BPE rules: split the text as
// the pre-tokenizer says, start from one symbol per character (or its
// byte-level / byte-fallback ids), then apply the lowest-ranked merge
// present, leftmost first, until none applies.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "tests/engine/tokenizer/test_tokenizers.h"

namespace trainerd::engine::tokenizer {
namespace {

using Ids = std::vector<int32_t>;
using nlohmann::json;

std::unique_ptr<Tokenizer> Load(const json& config) {
  auto tokenizer = Tokenizer::FromFile(testing::WriteJson(testing::MakeTempDir(), config));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

Ids EncodeOrDie(const Tokenizer& tokenizer, const std::string& text, bool add_special = true) {
  auto ids = tokenizer.Encode(text, add_special);
  EXPECT_TRUE(ids.ok()) << ids.status().message();
  return ids.ok() ? *ids : Ids{};
}

// The load error for `config`, which must fail.
std::string LoadError(const json& config) {
  auto tokenizer = Tokenizer::FromFile(testing::WriteJson(testing::MakeTempDir(), config));
  EXPECT_FALSE(tokenizer.ok());
  return tokenizer.ok() ? "" : tokenizer.status().message();
}

const std::vector<std::string>& HardTexts() {
  static const std::vector<std::string> texts = {
      "",
      " ",
      "   ",
      "\t\t",
      "\n",
      "\r\n",
      "line one\r\nline two\r\n",
      "hello the world",
      "  leading and trailing  ",
      "tabs\tand\t\tmore",
      "I'm, you're, they'LL, it's",
      "numbers 1234567890 and 3.14159",
      "日本語のテキストと中文",
      "Привет, мир!",
      "مرحبا بالعالم",
      "family: 👨‍👩‍👧‍👦 and flags 🇫🇷",
      "combining: e\xCC\x81 a\xCC\x8A n\xCC\x83",
      "mixed 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑ ≠ ∞",
      "<|end|> in text <|begin_of_text|>",
      "</s> and <s> inside",
      "emoji🙂without spaces",
      std::string(2000, 'a') + " " + std::string(300, ' ') + "end",
  };
  return texts;
}

TEST(ByteLevelBpeTest, MergesApplyLowestRankFirst) {
  auto tokenizer = Load(testing::ByteLevelBpe());
  ASSERT_NE(tokenizer, nullptr);
  // "hello" → h e l l o → he (rank 1) → ll (rank 3) → hell (4) → hello (5);
  // " the" → Ġ t h e → Ġt (0) → he (1) → Ġthe (2). BOS 264 from the template.
  EXPECT_EQ(EncodeOrDie(*tokenizer, "hello the"), (Ids{264, 261, 258}));
  EXPECT_EQ(EncodeOrDie(*tokenizer, "hello the", /*add_special=*/false), (Ids{261, 258}));
  // "hell" → he, ll → hell; "hel" → he l.
  EXPECT_EQ(EncodeOrDie(*tokenizer, "hell", false), (Ids{260}));
  EXPECT_EQ(EncodeOrDie(*tokenizer, "hel", false), (Ids{257, 108}));
}

TEST(ByteLevelBpeTest, SplitRegexCutsWords) {
  auto tokenizer = Load(testing::ByteLevelBpe());
  ASSERT_NE(tokenizer, nullptr);
  // (?i:'m) isolates the contraction, case-insensitively: I | 'm, I | 'M.
  EXPECT_EQ(EncodeOrDie(*tokenizer, "I'm", false), (Ids{73, 39, 109}));
  EXPECT_EQ(EncodeOrDie(*tokenizer, "I'M", false), (Ids{73, 39, 77}));
  // \p{N}{1,3}: "345" is one word, 3 4 5 → "34" 5; "12345" is 123 | 45, so
  // the "3 4" merge cannot cross the cut.
  EXPECT_EQ(EncodeOrDie(*tokenizer, "345", false), (Ids{262, 53}));
  EXPECT_EQ(EncodeOrDie(*tokenizer, "12345", false), (Ids{49, 50, 51, 52, 53}));
  // "  hi": \s+(?!\S) takes one space, then " hi" is one word: Ġ | Ġ h i.
  EXPECT_EQ(EncodeOrDie(*tokenizer, "  hi", false), (Ids{32, 32, 104, 105}));
  // "\r\n" is one word; bytes 13 and 10.
  EXPECT_EQ(EncodeOrDie(*tokenizer, "\r\n", false), (Ids{13, 10}));
}

TEST(ByteLevelBpeTest, IgnoreMergesTakesWholeWordsFromVocab) {
  auto plain = Load(testing::ByteLevelBpe(/*ignore_merges=*/false));
  auto ignoring = Load(testing::ByteLevelBpe(/*ignore_merges=*/true));
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(ignoring, nullptr);
  EXPECT_EQ(EncodeOrDie(*plain, "ab", false), (Ids{97, 98}));
  EXPECT_EQ(EncodeOrDie(*ignoring, "ab", false), (Ids{263}));
}

TEST(ByteLevelBpeTest, SpecialTokensInsideText) {
  auto tokenizer = Load(testing::ByteLevelBpe());
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(EncodeOrDie(*tokenizer, "hello<|end|>the"), (Ids{264, 261, 265, 116, 257}));
  EXPECT_EQ(EncodeOrDie(*tokenizer, "<|begin_of_text|>", false), (Ids{264}));
  // A partial special token is plain text: < | e n d | → "<|" is one word.
  EXPECT_EQ(EncodeOrDie(*tokenizer, "<|end", false), (Ids{60, 124, 101, 110, 100}));
  EXPECT_EQ(tokenizer->TokenToId("<|end|>"), 265);
  EXPECT_EQ(tokenizer->vocab_size(), 266);
  EXPECT_EQ(tokenizer->Decode({264, 261, 265}, false), "<|begin_of_text|>hello<|end|>");
  EXPECT_EQ(tokenizer->Decode({264, 261, 265}, true), "hello");
}

TEST(ByteLevelBpeTest, RoundTripsHardText) {
  auto tokenizer = Load(testing::ByteLevelBpe());
  ASSERT_NE(tokenizer, nullptr);
  for (const std::string& text : HardTexts()) {
    auto ids = tokenizer->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().message();
    EXPECT_EQ(tokenizer->Decode(*ids, /*skip_special_tokens=*/false), "<|begin_of_text|>" + text);
  }
}

TEST(SentencePieceBpeTest, PrependReplaceAndMerges) {
  auto tokenizer = Load(testing::SentencePieceBpe());
  ASSERT_NE(tokenizer, nullptr);
  // "hello" → "▁hello": ▁h (0), ll (1), ▁he (2), ▁hell (3), ▁hello (4).
  EXPECT_EQ(EncodeOrDie(*tokenizer, "hello"), (Ids{1, 268}));
  // "hi" → "▁hi": ▁h, and 'i' is not in the vocab → byte fallback <0x69> = 3 + 0x69.
  EXPECT_EQ(EncodeOrDie(*tokenizer, "hi"), (Ids{1, 264, 3 + 0x69}));
  // "é" → ▁ then bytes C3 A9.
  EXPECT_EQ(EncodeOrDie(*tokenizer, "é"), (Ids{1, 259, 3 + 0xC3, 3 + 0xA9}));
  // Whitespace only: "  " → "▁▁▁".
  EXPECT_EQ(EncodeOrDie(*tokenizer, "  "), (Ids{1, 259, 259, 259}));
  EXPECT_EQ(EncodeOrDie(*tokenizer, ""), (Ids{1}));
}

TEST(SentencePieceBpeTest, SpecialTokensSplitBeforeNormalization) {
  auto tokenizer = Load(testing::SentencePieceBpe());
  ASSERT_NE(tokenizer, nullptr);
  // Each piece between special tokens is normalized on its own, so "hello"
  // after "</s>" also gets its "▁" (as HF does).
  EXPECT_EQ(EncodeOrDie(*tokenizer, "hello</s>"), (Ids{1, 268, 2}));
  EXPECT_EQ(EncodeOrDie(*tokenizer, "</s>hello"), (Ids{1, 2, 268}));
  EXPECT_EQ(EncodeOrDie(*tokenizer, "<s>", false), (Ids{1}));
}

TEST(SentencePieceBpeTest, DecodeFollowsLlama2Decoder) {
  auto tokenizer = Load(testing::SentencePieceBpe());
  ASSERT_NE(tokenizer, nullptr);
  // Tokens "<s>", "▁hello" → "<s> hello": Strip removes a leading space only.
  EXPECT_EQ(tokenizer->Decode({1, 268}), "<s> hello");
  EXPECT_EQ(tokenizer->Decode({1, 268}, true), "hello");
  // Invalid byte runs become one U+FFFD per byte.
  EXPECT_EQ(tokenizer->Decode({259, 3 + 0xC3}, true), "\xEF\xBF\xBD");
  for (const std::string& text : HardTexts()) {
    if (text.find("<s>") != std::string::npos) continue;  // skipped special tokens do not come back
    auto ids = tokenizer->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().message();
    EXPECT_EQ(tokenizer->Decode(*ids, /*skip_special_tokens=*/true), text) << text;
  }
}

TEST(TokenizerTest, InvalidUtf8NamesTheByteOffset) {
  auto tokenizer = Load(testing::SentencePieceBpe());
  ASSERT_NE(tokenizer, nullptr);
  for (const std::string& bad : {std::string("ab\xff"), std::string("ab\xC3"), std::string("ab\xED\xA0\x80")}) {
    auto ids = tokenizer->Encode(bad);
    ASSERT_FALSE(ids.ok());
    EXPECT_NE(ids.status().message().find("byte offset 2"), std::string::npos) << ids.status().message();
  }
}

TEST(TokenizerTest, FromFileAcceptsAModelFolder) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteJson(dir, testing::SentencePieceBpe());
  auto tokenizer = Tokenizer::FromFile(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  auto missing = Tokenizer::FromFile(testing::MakeTempDir());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no tokenizer.json"), std::string::npos);
}

TEST(TokenizerTest, UnsupportedNormalizer) {
  json config = testing::SentencePieceBpe();
  config["normalizer"] = {{"type", "NFKC"}};
  EXPECT_NE(LoadError(config).find("normalizer type \"NFKC\" is not supported"), std::string::npos);
}

TEST(TokenizerTest, UnsupportedPreTokenizerInsideSequence) {
  json config = testing::ByteLevelBpe();
  config["pre_tokenizer"]["pretokenizers"].push_back({{"type", "BertPreTokenizer"}});
  const std::string error = LoadError(config);
  EXPECT_NE(error.find("tokenizer.json: pre_tokenizer type \"BertPreTokenizer\" is not supported"),
            std::string::npos)
      << error;
}

TEST(TokenizerTest, UnsupportedModel) {
  json config = testing::SentencePieceBpe();
  config["model"]["type"] = "WordPiece";
  EXPECT_NE(LoadError(config).find("model type \"WordPiece\" is not supported"), std::string::npos);
}

TEST(TokenizerTest, UnsupportedPostProcessor) {
  json config = testing::SentencePieceBpe();
  config["post_processor"] = {{"type", "RobertaProcessing"}};
  EXPECT_NE(LoadError(config).find("post_processor type \"RobertaProcessing\" is not supported"),
            std::string::npos);
}

TEST(TokenizerTest, UnsupportedDecoder) {
  json config = testing::SentencePieceBpe();
  config["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(LoadError(config).find("decoder type \"WordPiece\" is not supported"), std::string::npos);
}

TEST(TokenizerTest, UnsupportedBpeOptions) {
  json dropout = testing::SentencePieceBpe();
  dropout["model"]["dropout"] = 0.1;
  EXPECT_NE(LoadError(dropout).find("dropout 0.1 is not supported"), std::string::npos);
  json prefix = testing::SentencePieceBpe();
  prefix["model"]["continuing_subword_prefix"] = "##";
  EXPECT_NE(LoadError(prefix).find("continuing_subword_prefix \"##\" is not supported"), std::string::npos);
  json truncation = testing::SentencePieceBpe();
  truncation["truncation"] = {{"max_length", 8}};
  EXPECT_NE(LoadError(truncation).find("\"truncation\" is set"), std::string::npos);
}

TEST(TokenizerTest, MalformedFiles) {
  const std::string dir = testing::MakeTempDir();
  std::ofstream(dir + "/tokenizer.json") << "{\"model\": ";
  auto broken = Tokenizer::FromFile(dir);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("not valid JSON"), std::string::npos);

  json bad_merge = testing::SentencePieceBpe();
  bad_merge["model"]["merges"].push_back("x y");
  EXPECT_NE(LoadError(bad_merge).find("merge 6 uses \"x\", which is not in the vocab"), std::string::npos);
  json three_part = testing::SentencePieceBpe();
  three_part["model"]["merges"].push_back("a b c");
  EXPECT_NE(LoadError(three_part).find("is not two tokens"), std::string::npos);
  json no_vocab = testing::SentencePieceBpe();
  no_vocab["model"].erase("vocab");
  EXPECT_NE(LoadError(no_vocab).find("\"vocab\" must be an object"), std::string::npos);
  json bad_regex = testing::ByteLevelBpe();
  bad_regex["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_NE(LoadError(bad_regex).find("does not compile"), std::string::npos);
}

}  // namespace
}  // namespace trainerd::engine::tokenizer
