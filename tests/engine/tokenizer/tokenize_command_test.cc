// `trainerd-worker tokenize`: JSONL texts in, JSONL ids out, bad lines named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <sys/wait.h>

#include "tests/engine/tokenizer/test_tokenizers.h"

namespace trainerd::engine::tokenizer {
namespace {

struct Result {
  int exit_code;
  std::string out, err;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `trainerd-worker tokenize MODEL ARGS` on `input`; ARGS go to the shell as they are.
Result RunTokenize(const std::string& model, const std::string& input, const std::string& args = "") {
  const std::string dir = testing::MakeTempDir();
  std::ofstream(dir + "/in.jsonl") << input;
  const std::string command = std::string(TRAINERD_BINARY_DIR) + "/bin/trainerd-worker tokenize '" + model +
                              "' " + args + " < " + dir + "/in.jsonl > " + dir + "/out 2> " + dir + "/err";
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadAll(dir + "/out"), ReadAll(dir + "/err")};
}

TEST(TokenizeCommandTest, WritesIdsPerLine) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteJson(dir, testing::SentencePieceBpe());
  Result r = RunTokenize(dir, "{\"text\": \"hello\"}\n{\"text\": \"\"}\n{\"text\": \"hi</s>\"}\n");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "{\"ids\": [1, 268]}\n{\"ids\": [1]}\n{\"ids\": [1, 264, 108, 2]}\n");
}

TEST(TokenizeCommandTest, MalformedLineIsNamed) {
  const std::string dir = testing::MakeTempDir();
  const std::string file = testing::WriteJson(dir, testing::SentencePieceBpe());
  Result bad_json = RunTokenize(file, "{\"text\": \"ok\"}\n{\"text\": \n");
  EXPECT_EQ(bad_json.exit_code, 1);
  EXPECT_NE(bad_json.err.find("<stdin>:2: malformed JSON"), std::string::npos) << bad_json.err;
  Result missing = RunTokenize(file, "{\"txt\": \"ok\"}\n");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("<stdin>:1: missing \"text\""), std::string::npos) << missing.err;
  Result wrong_type = RunTokenize(file, "{\"text\": 3}\n");
  EXPECT_EQ(wrong_type.exit_code, 1);
  EXPECT_NE(wrong_type.err.find("<stdin>:1: \"text\" must be a string"), std::string::npos) << wrong_type.err;
}

TEST(TokenizeCommandTest, UnsupportedTokenizerFails) {
  const std::string dir = testing::MakeTempDir();
  auto config = testing::SentencePieceBpe();
  config["normalizer"] = {{"type", "NFKC"}};
  testing::WriteJson(dir, config);
  Result r = RunTokenize(dir, "{\"text\": \"x\"}\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("normalizer type \"NFKC\" is not supported"), std::string::npos) << r.err;
}

// `count` JSONL {"text"} lines of mixed lengths and scripts (deterministic):
// words, digits, punctuation, non-Latin text, newlines and special tokens.
std::string MixedLines(size_t count) {
  const char* pieces[] = {"hello",  " hello", " the",    "the",  "34",   " 1234", "ab", "  ", "\n",
                          "\t",     "it's",   " world!", "{\"k\": 1}", "日本語", " русский", "😀",
                          "e\u0301", "<s>",    "</s>",   "<|end|>", "<|begin_of_text|>", "x"};
  std::mt19937 rng(7);
  std::string input;
  for (size_t i = 0; i < count; ++i) {
    // Mostly short lines, some long ones.
    const size_t n = rng() % 10 == 0 ? 50 + rng() % 400 : rng() % 12;
    std::string text;
    for (size_t k = 0; k < n; ++k) text += pieces[rng() % (sizeof(pieces) / sizeof(pieces[0]))];
    input += nlohmann::json{{"text", text}}.dump() + "\n";
  }
  return input;
}

size_t CountLines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

TEST(TokenizeCommandTest, OutputIsTheSameForAnyThreadCount) {
  // More lines than one batch (4096), so batches and their order are exercised.
  const std::string input = MixedLines(9000);
  for (const auto& config : {testing::ByteLevelBpe(true), testing::SentencePieceBpe()}) {
    const std::string dir = testing::MakeTempDir();
    const std::string file = testing::WriteJson(dir, config);
    Result one = RunTokenize(file, input, "--threads 1");
    ASSERT_EQ(one.exit_code, 0) << one.err;
    EXPECT_EQ(CountLines(one.out), 9000u);
    Result four = RunTokenize(file, input, "--threads 4");
    ASSERT_EQ(four.exit_code, 0) << four.err;
    EXPECT_TRUE(one.out == four.out) << "--threads 1 and --threads 4 differ";
    Result all_cores = RunTokenize(file, input);
    ASSERT_EQ(all_cores.exit_code, 0) << all_cores.err;
    EXPECT_TRUE(one.out == all_cores.out) << "--threads 1 and the default (all cores) differ";
  }
}

TEST(TokenizeCommandTest, ThreadsMustBeAPositiveCount) {
  const std::string dir = testing::MakeTempDir();
  const std::string file = testing::WriteJson(dir, testing::SentencePieceBpe());
  for (const std::string args : {"--threads 0", "--threads x", "--threads"}) {
    SCOPED_TRACE(args);
    Result r = RunTokenize(file, "{\"text\": \"hello\"}\n", args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--threads wants a thread count"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
  Result ok = RunTokenize(file, "{\"text\": \"hello\"}\n", "--threads 3");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.out, "{\"ids\": [1, 268]}\n");
}

TEST(TokenizeCommandTest, ErrorAfterTheFirstBatchNamesItsLine) {
  const std::string dir = testing::MakeTempDir();
  const std::string file = testing::WriteJson(dir, testing::SentencePieceBpe());
  // Line 6001 is bad (in the second batch), and so is line 8000: the first one is named.
  std::string input = MixedLines(6000) + "{\"text\": 7}\n" + MixedLines(1998) + "not json\n" + MixedLines(10);
  for (const std::string args : {"--threads 1", "--threads 4"}) {
    SCOPED_TRACE(args);
    Result r = RunTokenize(file, input, args);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("<stdin>:6001: \"text\" must be a string"), std::string::npos) << r.err;
    EXPECT_EQ(CountLines(r.out), 6000u) << "every line before the bad one is written";
  }
}

}  // namespace
}  // namespace trainerd::engine::tokenizer
