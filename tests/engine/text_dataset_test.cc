#include "engine/text_dataset.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/engine/tokenizer/test_tokenizers.h"

namespace trainerd::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tokenizer::Tokenizer;

// The byte-level tokenizer of test_tokenizers.h: a lone byte b is id b,
// 257 "he", 258 "Ġthe", 261 "hello", 264 "<|begin_of_text|>" (added in front of
// every text by the post-processor), 265 "<|end|>" (our EOS).
constexpr int64_t kBos = 264, kEos = 265, kHello = 261, kSpaceThe = 258, kHe = 257;
constexpr int64_t kVocab = 266;
constexpr int64_t kM = kIgnoreIndex;

void ExpectErrorContains(const Status& status, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(status.ok()) << "expected an error";
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "message lacks \"" << part << "\": " << status.message();
  }
}

class TextDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = tokenizer::testing::MakeTempDir();
    tokenizer::testing::WriteJson(model_, tokenizer::testing::ByteLevelBpe());
    WriteFile("tokenizer_config.json", R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|end|>"})");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(model_, ec);
  }

  // Writes `text` to model_/name; returns its path.
  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = model_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string Data(const std::string& text) { return WriteFile("data.jsonl", text); }

  StatusOr<TokenDataset> Load(const std::string& format, const std::string& text, int64_t max_seq_len = 2048,
                              bool train_on_prompt = false) {
    path_ = Data(text);
    DataOptions options;
    options.model_dir = model_;
    options.format = format;
    options.vocab_size = kVocab;
    options.max_seq_len = max_seq_len;
    options.train_on_prompt = train_on_prompt;
    DatasetLoader loader(options);
    return loader.Load(path_);
  }

  std::unique_ptr<Tokenizer> Tok() {
    auto tok = Tokenizer::FromFile(model_);
    EXPECT_TRUE(tok.ok()) << tok.status().message();
    return tok.ok() ? std::move(tok).value() : nullptr;
  }

  std::string model_;
  std::string path_;
};

TEST_F(TextDatasetTest, TextIsEncodedWithSpecialTokensThenEosAllTrained) {
  auto data = Load("text", "{\"text\": \"hello the\"}\n\n{\"text\": \"\", \"id\": 7}\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  ASSERT_EQ(data->examples.size(), 2u);
  EXPECT_EQ(data->lines, 2);
  EXPECT_EQ(data->examples[0].input_ids, (std::vector<int64_t>{kBos, kHello, kSpaceThe, kEos}));
  EXPECT_EQ(data->examples[0].labels, data->examples[0].input_ids);
  // Extra fields are ignored; an empty text still trains EOS.
  EXPECT_EQ(data->examples[1].input_ids, (std::vector<int64_t>{kBos, kEos}));
  EXPECT_EQ(data->examples[1].labels, (std::vector<int64_t>{kBos, kEos}));
}

TEST_F(TextDatasetTest, TextEndingWithEosGetsNoSecondOne) {
  auto data = Load("text", "{\"text\": \"hello<|end|>\"}\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->examples[0].input_ids, (std::vector<int64_t>{kBos, kHello, kEos}));
}

TEST_F(TextDatasetTest, CompletionMasksThePrompt) {
  auto data = Load("completion", "{\"prompt\": \"hello\", \"completion\": \" the\"}\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  ASSERT_EQ(data->examples.size(), 1u);
  EXPECT_EQ(data->examples[0].input_ids, (std::vector<int64_t>{kBos, kHello, kSpaceThe, kEos}));
  EXPECT_EQ(data->examples[0].labels, (std::vector<int64_t>{kM, kM, kSpaceThe, kEos}));
  EXPECT_EQ(data->examples[0].target_tokens(), 2);
}

TEST_F(TextDatasetTest, CompletionIsOneTextAndThePromptLengthIsItsOwnEncoding) {
  // Encode("hel") = [BOS, "he", "l"]: 3 ids; Encode("hello") = [BOS, "hello"]: the
  // merged token spans the boundary and is masked; EOS is still trained.
  auto data = Load("completion", "{\"prompt\": \"hel\", \"completion\": \"lo\"}\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->examples[0].input_ids, (std::vector<int64_t>{kBos, kHello, kEos}));
  EXPECT_EQ(data->examples[0].labels, (std::vector<int64_t>{kM, kM, kEos}));
  // And when the prompt's tokens survive intact: "he" + "!" keeps "he".
  data = Load("completion", "{\"prompt\": \"he\", \"completion\": \"!\"}\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->examples[0].input_ids, (std::vector<int64_t>{kBos, kHe, '!', kEos}));
  EXPECT_EQ(data->examples[0].labels, (std::vector<int64_t>{kM, kM, '!', kEos}));
}

TEST_F(TextDatasetTest, TrainOnPromptTrainsEverything) {
  auto data = Load("completion", "{\"prompt\": \"hello\", \"completion\": \" the\"}\n", 2048, true);
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->examples[0].labels, (std::vector<int64_t>{kBos, kHello, kSpaceThe, kEos}));
}

TEST_F(TextDatasetTest, TruncationAndDroppingAreCounted) {
  // max_seq_len 2: "hello the" → [BOS, hello] (1 target); the completion's
  // prompt fills both positions → dropped.
  auto data = Load("text", "{\"text\": \"hello the\"}\n", 2);
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->examples[0].input_ids, (std::vector<int64_t>{kBos, kHello}));
  EXPECT_EQ(data->truncated, 1);
  data = Load("completion",
              "{\"prompt\": \"hello\", \"completion\": \" the\"}\n{\"prompt\": \"\", \"completion\": \"hello\"}\n", 2);
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->lines, 2);
  EXPECT_EQ(data->truncated, 2);
  EXPECT_EQ(data->dropped, 1);
  ASSERT_EQ(data->examples.size(), 1u);
  EXPECT_EQ(data->examples[0].labels, (std::vector<int64_t>{kM, kHello}));
}

TEST_F(TextDatasetTest, NothingToTrainIsAnErrorWithTheCounts) {
  auto data = Load("completion",
                   "{\"prompt\": \"hello\", \"completion\": \" the\"}\n{\"prompt\": \"hello\", \"completion\": \"\"}\n", 2);
  ExpectErrorContains(data.status(), {path_, "all 2 examples have nothing to train", "2 of them truncated"});
}

TEST_F(TextDatasetTest, AutoDetectsTheFormat) {
  auto data = Load("auto", "\n{\"text\": \"hello\"}\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->examples[0].input_ids, (std::vector<int64_t>{kBos, kHello, kEos}));
  data = Load("auto", "{\"completion\": \" the\", \"prompt\": \"hello\"}\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->examples[0].labels, (std::vector<int64_t>{kM, kM, kSpaceThe, kEos}));
  data = Load("auto", "{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, 3]}\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->examples[0].input_ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(data->examples[0].labels, (std::vector<int64_t>{kM, 2, 3}));

  auto format = DetectDataFormat(Data("{\"text\": \"a\"}\n"));
  ASSERT_TRUE(format.ok());
  EXPECT_EQ(*format, "text");
}

TEST_F(TextDatasetTest, AutoDetectsChatAndRefusesUnknownShapes) {
  EXPECT_EQ(*DetectDataFormat(Data("{\"messages\": []}\n")), "chat");
  EXPECT_EQ(*DetectDataFormat(Data("\n{\"conversations\": []}\n")), "chat");
  ExpectErrorContains(Load("auto", "{\"prompt\": \"hello\"}\n").status(),
                      {path_ + ":1:", "cannot tell the data format", "prompt"});
  ExpectErrorContains(Load("auto", "{\"text\": \n").status(), {path_ + ":1:", "not valid JSON"});
  ExpectErrorContains(Load("auto", "\n  \n").status(), {path_, "empty"});
}

TEST_F(TextDatasetTest, MalformedJsonNamesTheLine) {
  ExpectErrorContains(Load("text", "{\"text\": \"a\"}\n{\"text\": \"b\"\n").status(), {path_ + ":2:", "not valid JSON"});
  ExpectErrorContains(Load("text", "[\"a\"]\n").status(), {path_ + ":1:", "expected a JSON object, got a list"});
}

TEST_F(TextDatasetTest, MissingFieldNamesTheLine) {
  ExpectErrorContains(Load("text", "{\"text\": \"a\"}\n{\"txt\": \"b\"}\n").status(),
                      {path_ + ":2:", "missing \"text\"", "txt"});
  ExpectErrorContains(Load("completion", "{\"prompt\": \"a\"}\n").status(), {path_ + ":1:", "missing \"completion\""});
  ExpectErrorContains(Load("completion", "{\"completion\": \"a\"}\n").status(), {path_ + ":1:", "missing \"prompt\""});
}

TEST_F(TextDatasetTest, WrongTypeNamesTheLine) {
  ExpectErrorContains(Load("text", "{\"text\": 5}\n").status(), {path_ + ":1:", "\"text\" must be a string, got a number"});
  ExpectErrorContains(Load("completion", "{\"prompt\": \"a\", \"completion\": [\"b\"]}\n").status(),
                      {path_ + ":1:", "\"completion\" must be a string, got a list"});
  ExpectErrorContains(Load("completion", "{\"prompt\": null, \"completion\": \"b\"}\n").status(),
                      {path_ + ":1:", "\"prompt\" must be a string, got null"});
}

TEST_F(TextDatasetTest, InvalidUtf8NamesTheLine) {
  ExpectErrorContains(Load("text", "{\"text\": \"ok\"}\n{\"text\": \"bad \xff byte\"}\n").status(),
                      {path_ + ":2:", "not valid UTF-8 at byte offset 14"});
  ExpectErrorContains(Load("auto", "{\"text\": \"\xc3\"}\n").status(), {path_ + ":1:", "not valid UTF-8"});
}

TEST_F(TextDatasetTest, EmptyFile) {
  ExpectErrorContains(Load("text", "").status(), {path_, "the data file is empty"});
  ExpectErrorContains(Load("completion", "\n \r\n").status(), {path_, "the data file is empty"});
}

TEST_F(TextDatasetTest, MissingTokenizerIsAnErrorSayingSo) {
  fs::remove(model_ + "/tokenizer.json");
  ExpectErrorContains(Load("text", "{\"text\": \"a\"}\n").status(),
                      {"model.path " + model_ + " has no tokenizer.json", "data.format text"});
  ExpectErrorContains(Load("auto", "{\"prompt\": \"a\", \"completion\": \"b\"}\n").status(),
                      {"has no tokenizer.json", "data.format completion (detected from"});
  // Tokens data needs no tokenizer.
  EXPECT_TRUE(Load("auto", "{\"input_ids\": [1, 2]}\n").ok());
}

TEST_F(TextDatasetTest, IdsOutsideTheModelVocabularyAreAnError) {
  auto tok = Tok();
  ASSERT_TRUE(tok);
  EncoderSetup setup;
  setup.format = "text";
  setup.tokenizer = tok.get();
  setup.eos_id = 10;
  setup.vocab_size = 262;
  auto data = LoadTextDataset(Data("{\"text\": \"hello\"}\n"), ExampleEncoder(setup), 2048, 2);
  ExpectErrorContains(data.status(), {":1:", "id 264", "outside the model's vocabulary [0, 262)"});
}

TEST_F(TextDatasetTest, EosFromTokenizerConfigOrModelConfig) {
  auto tok = Tok();
  ASSERT_TRUE(tok);
  auto eos = FindEosTokenId(model_, *tok);
  ASSERT_TRUE(eos.ok()) << eos.status().message();
  EXPECT_EQ(*eos, kEos);

  WriteFile("tokenizer_config.json", R"({"eos_token": {"content": "<|begin_of_text|>", "special": true}})");
  eos = FindEosTokenId(model_, *tok);
  ASSERT_TRUE(eos.ok()) << eos.status().message();
  EXPECT_EQ(*eos, kBos);

  WriteFile("tokenizer_config.json", R"({"eos_token": "</s>"})");
  ExpectErrorContains(FindEosTokenId(model_, *tok).status(), {"tokenizer_config.json", "'</s>' is not a token"});

  WriteFile("tokenizer_config.json", R"({"eos_token": null})");
  WriteFile("generation_config.json", R"({"eos_token_id": [7, 265]})");
  eos = FindEosTokenId(model_, *tok);
  ASSERT_TRUE(eos.ok()) << eos.status().message();
  EXPECT_EQ(*eos, 7);

  WriteFile("config.json", R"({"model_type": "llama", "eos_token_id": 100})");
  eos = FindEosTokenId(model_, *tok);
  ASSERT_TRUE(eos.ok()) << eos.status().message();
  EXPECT_EQ(*eos, 100) << "config.json comes before generation_config.json";

  fs::remove(model_ + "/tokenizer_config.json");
  fs::remove(model_ + "/generation_config.json");
  WriteFile("config.json", R"({"model_type": "llama"})");
  ExpectErrorContains(FindEosTokenId(model_, *tok).status(), {"no end-of-sequence token"});
  // And the loader says so before reading any data.
  ExpectErrorContains(Load("text", "{\"text\": \"a\"}\n").status(), {"no end-of-sequence token"});

  WriteFile("config.json", R"({"eos_token_id": "x"})");
  ExpectErrorContains(FindEosTokenId(model_, *tok).status(), {"config.json", "eos_token_id must be"});
}

}  // namespace
}  // namespace trainerd::engine
