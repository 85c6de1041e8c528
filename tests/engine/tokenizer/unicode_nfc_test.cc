// Unicode NFC against Python's unicodedata.normalize("NFC") on the vectors
// tools/make_unicode_tables.py wrote (tests/fixtures/unicode/nfc_cases.jsonl),
// and the tokenizer's "NFC" normalizer.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode_nfc.h"
#include "engine/tokenizer/utf8.h"
#include "tests/engine/tokenizer/test_tokenizers.h"

namespace trainerd::engine::tokenizer {
namespace {

using nlohmann::json;

std::string Hex(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t length = Utf8Length(static_cast<unsigned char>(s[i]));
    char buf[16];
    if (i + length > s.size() || FindInvalidUtf8(s.substr(i, length)) != std::string::npos) {
      std::snprintf(buf, sizeof buf, "%s<%02X>", out.empty() ? "" : " ", static_cast<unsigned char>(s[i]));
      length = 1;
    } else {
      std::snprintf(buf, sizeof buf, "%sU+%04X", out.empty() ? "" : " ",
                    static_cast<unsigned>(DecodeUtf8At(s, i, &length)));
    }
    out += buf;
    i += length;
  }
  return out;
}

TEST(UnicodeNfcTest, MatchesPythonUnicodedata) {
  const std::string path = std::string(TRAINERD_FIXTURES) + "/unicode/nfc_cases.jsonl";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path;
  std::string line;
  int cases = 0, failures = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const json j = json::parse(line);
    const std::string input = j.at("in"), expected = j.at("nfc");
    ++cases;
    const std::string got = NormalizeNfc(input);
    if (got != expected && ++failures <= 20) {
      ADD_FAILURE() << "line " << cases << ": NFC(" << Hex(input) << ")\n  got      " << Hex(got)
                    << "\n  expected " << Hex(expected);
    }
    // NFC is idempotent.
    if (NormalizeNfc(expected) != expected && ++failures <= 20)
      ADD_FAILURE() << "line " << cases << ": NFC not idempotent on " << Hex(expected);
  }
  EXPECT_GT(cases, 5000);
  EXPECT_EQ(failures, 0);
}

TEST(UnicodeNfcTest, Examples) {
  EXPECT_EQ(NormalizeNfc(""), "");
  EXPECT_EQ(NormalizeNfc("plain ascii"), "plain ascii");
  EXPECT_EQ(NormalizeNfc("cafe\xCC\x81"), "caf\xC3\xA9");                  // e U+0301 -> U+00E9
  EXPECT_EQ(NormalizeNfc("a\xCC\xA3\xCC\x81"), "\xE1\xBA\xA1\xCC\x81");     // a U+0323 U+0301 -> U+1EA1 U+0301
  EXPECT_EQ(NormalizeNfc("a\xCC\x81\xCC\xA3"), "\xE1\xBA\xA1\xCC\x81");     // reordered first
  EXPECT_EQ(NormalizeNfc("\xE2\x84\xAB"), "\xC3\x85");                      // U+212B ANGSTROM SIGN -> U+00C5
  EXPECT_EQ(NormalizeNfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // jamo -> U+AC01
  EXPECT_EQ(NormalizeNfc("\xEF\xAC\x81"), "\xEF\xAC\x81");                  // U+FB01 ligature: compatibility only
  EXPECT_EQ(NormalizeNfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");      // U+0958: composition exclusion
  EXPECT_EQ(NormalizeNfc("x\xCC\x81\xFF"), "x\xCC\x81\xFF");                // invalid UTF-8: unchanged
  EXPECT_EQ(CanonicalCombiningClass(0x301), 230);
  EXPECT_EQ(CanonicalCombiningClass('a'), 0);
}

std::unique_ptr<Tokenizer> Load(const json& config) {
  auto tokenizer = Tokenizer::FromFile(testing::WriteJson(testing::MakeTempDir(), config));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

std::vector<int32_t> Encode(const Tokenizer& tokenizer, const std::string& text) {
  auto ids = tokenizer.Encode(text, false);
  EXPECT_TRUE(ids.ok()) << ids.status().message();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(UnicodeNfcTest, TokenizerNfcNormalizerComposes) {
  const std::string composed = "caf\xC3\xA9 \xE1\xBB\x87 \xEA\xB0\x81 the hello";
  const std::string decomposed = "cafe\xCC\x81 e\xCC\xA3\xCC\x82 \xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8 the hello";
  const std::string reordered = "cafe\xCC\x81 e\xCC\x82\xCC\xA3 \xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8 the hello";

  json plain = testing::ByteLevelBpe();
  auto without = Load(plain);
  ASSERT_NE(without, nullptr);
  EXPECT_NE(Encode(*without, composed), Encode(*without, decomposed));  // no normalizer: bytes differ

  for (const json& normalizer :
       {json{{"type", "NFC"}}, json{{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}}}) {
    json config = testing::ByteLevelBpe();
    config["normalizer"] = normalizer;
    auto tokenizer = Load(config);
    ASSERT_NE(tokenizer, nullptr) << normalizer.dump();
    const auto ids = Encode(*tokenizer, composed);
    EXPECT_EQ(ids, Encode(*without, composed));  // NFC input is unchanged
    EXPECT_EQ(Encode(*tokenizer, decomposed), ids) << normalizer.dump();
    EXPECT_EQ(Encode(*tokenizer, reordered), ids) << normalizer.dump();
  }
}

}  // namespace
}  // namespace trainerd::engine::tokenizer
