// Parity with Hugging Face tokenizers on fixtures it generated:
// tests/fixtures/tokenizers/NAME/{tokenizer.json, corpus.jsonl {"text"},
// expected.jsonl {"ids"}, decoded.jsonl {"text"}}, one line per corpus line.
// Ids must match exactly (encode with special tokens, HF's default) and so
// must decode(expected ids) (skip_special_tokens=false).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer.h"
#include "tests/read_jsonl.h"

namespace trainerd::engine::tokenizer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using trainerd::testing::ReadJsonl;

TEST(TokenizerParityTest, MatchesHuggingFaceOnEveryFixture) {
  const fs::path root = fs::path(TRAINERD_FIXTURES) / "tokenizers";
  if (!fs::is_directory(root)) GTEST_SKIP() << "no parity fixtures yet: " << root << " does not exist";
  int fixtures = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (!entry.is_directory()) continue;
    const fs::path dir = entry.path();
    SCOPED_TRACE(dir.string());
    ++fixtures;
    auto tokenizer = Tokenizer::FromFile(dir.string());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
    const auto corpus = ReadJsonl(dir / "corpus.jsonl");
    const auto expected = ReadJsonl(dir / "expected.jsonl");
    ASSERT_EQ(corpus.size(), expected.size());
    std::vector<json> decoded;
    if (fs::exists(dir / "decoded.jsonl")) {
      decoded = ReadJsonl(dir / "decoded.jsonl");
      ASSERT_EQ(decoded.size(), corpus.size());
    }
    int mismatches = 0;
    for (size_t i = 0; i < corpus.size() && mismatches < 10; ++i) {
      const std::string text = corpus[i].at("text").get<std::string>();
      const auto want = expected[i].at("ids").get<std::vector<int32_t>>();
      auto got = (*tokenizer)->Encode(text);
      ASSERT_TRUE(got.ok()) << "line " << i + 1 << ": " << got.status().message();
      if (*got != want) {
        ++mismatches;
        ADD_FAILURE() << "line " << i + 1 << ": ids differ from HF for " << json(text).dump() << "\n  want "
                      << json(want).dump() << "\n  got  " << json(*got).dump();
      }
      if (!decoded.empty()) {
        const std::string want_text = decoded[i].at("text").get<std::string>();
        EXPECT_EQ((*tokenizer)->Decode(want), want_text) << "line " << i + 1 << ": decode differs";
      }
    }
  }
  if (fixtures == 0) GTEST_SKIP() << root << " has no fixture folders yet";
}

}  // namespace
}  // namespace trainerd::engine::tokenizer
