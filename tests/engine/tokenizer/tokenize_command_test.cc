// `trainerd-worker tokenize`: JSONL texts in, JSONL ids out, bad lines named.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
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

Result RunTokenize(const std::string& model, const std::string& input) {
  const std::string dir = testing::MakeTempDir();
  std::ofstream(dir + "/in.jsonl") << input;
  const std::string command = std::string(TRAINERD_BINARY_DIR) + "/worker/trainerd-worker tokenize '" + model +
                              "' < " + dir + "/in.jsonl > " + dir + "/out 2> " + dir + "/err";
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

}  // namespace
}  // namespace trainerd::engine::tokenizer
