// The chat data format: built-in templates (rendered text, recognition from a
// model's Jinja template), assistant-only masks through
// Tokenizer::EncodeWithCuts, ShareGPT input, bad input naming file:line, the
// tokenized cache and multi-threaded tokenization. Parity with transformers'
// apply_chat_template on generated fixtures is chat_parity_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/chat_template.h"
#include "engine/text_dataset.h"
#include "tests/engine/tokenizer/test_tokenizers.h"
#include "tests/temp_dir.h"

namespace trainerd::engine {
namespace {

using nlohmann::json;
using testing::ExpectErrorContains;
using testing::TempDir;

constexpr int64_t kM = kIgnoreIndex;
// test_tokenizers.h's byte-level tokenizer (a lone byte b is id b, 257 "he",
// 261 "hello", 264 "<|begin_of_text|>", 265 "<|end|>") plus these added tokens.
constexpr int64_t kBot = 264, kStartHeader = 266, kEndHeader = 267, kEot = 268, kImStart = 269, kImEnd = 270;
constexpr int64_t kHello = 261, kVocab = 271;

json ChatTokenizer() {
  json j = tokenizer::testing::ByteLevelBpe();
  int id = 266;
  for (const char* token : {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"}) {
    j["added_tokens"].push_back(tokenizer::testing::SpecialAddedToken(id++, token));
  }
  return j;
}

std::vector<int64_t> Bytes(const std::string& s) { return std::vector<int64_t>(s.begin(), s.end()); }
std::vector<int64_t> Cat(std::initializer_list<std::vector<int64_t>> parts) {
  std::vector<int64_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
std::vector<int64_t> Masked(size_t n) { return std::vector<int64_t>(n, kM); }

std::string Render(const std::string& name, const std::vector<ChatMessage>& messages) {
  StatusOr<ChatTemplate> t = ChatTemplate::Builtin(name);
  EXPECT_TRUE(t.ok()) << t.status().message();
  StatusOr<std::vector<ChatPiece>> pieces = t->Render(messages, "<s>", "</s>");
  EXPECT_TRUE(pieces.ok()) << pieces.status().message();
  std::string text;
  for (const ChatPiece& p : *pieces) text += p.assistant ? "{" + p.text + "}" : p.text;
  return text;
}

TEST(ChatTemplateTest, RendersEachFamilyWithAssistantPiecesMarked) {
  const std::vector<ChatMessage> chat = {{"system", "Be brief."}, {"user", " Hi "}, {"assistant", " Hello! "},
                                         {"user", "Bye"}, {"assistant", "Bye."}};
  // {} marks the trained (assistant) pieces.
  EXPECT_EQ(Render("llama3", chat),
            "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n{Hello!<|eot_id|>}"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n{Bye.<|eot_id|>}");
  EXPECT_EQ(Render("chatml", chat),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n"
            "<|im_start|>assistant\n{ Hello! <|im_end|>}\n<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n{Bye.<|im_end|>}\n");
  EXPECT_EQ(Render("qwen2", {{"user", "Hi"}, {"assistant", "Yo"}}),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n{Yo<|im_end|>}\n");
  EXPECT_EQ(Render("qwen2.5", {{"system", "S"}, {"user", "Hi"}}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(Render("mistral", {{"user", " Hi "}, {"assistant", " Yo "}, {"user", "Q"}}),
            "<s>[INST]  Hi  [/INST]{ Yo </s>}[INST] Q [/INST]");
  EXPECT_EQ(Render("mistral-v0.1", {{"user", "Hi"}, {"assistant", "Yo"}, {"user", "Q"}}),
            "<s>[INST] Hi [/INST]{Yo</s>} [INST] Q [/INST]");
  EXPECT_EQ(Render("llama2", chat),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST] {Hello! </s>}<s>[INST] Bye [/INST] {Bye. </s>}");
  EXPECT_EQ(Render("llama2", {{"user", "Hi"}}), "<s>[INST] Hi [/INST]");
}

TEST(ChatTemplateTest, BadConversationsNameTheMessage) {
  auto render = [](const std::string& name, const std::vector<ChatMessage>& m) {
    return ChatTemplate::Builtin(name)->Render(m, "<s>", "</s>").status();
  };
  ExpectErrorContains(render("chatml", {{"user", "a"}, {"tool", "b"}}),
                      {"messages[1]", "role 'tool'", "chatml", "system, user, assistant"});
  ExpectErrorContains(render("llama3", {{"user", "a"}, {"system", "b"}}),
                      {"messages[1]", "system message must be the first"});
  ExpectErrorContains(render("mistral", {{"system", "a"}, {"user", "b"}}), {"messages[0]", "role 'system'"});
  ExpectErrorContains(render("mistral", {{"user", "a"}, {"user", "b"}}),
                      {"messages[1]", "wants 'assistant'", "alternate"});
  ExpectErrorContains(render("llama2", {{"system", "s"}, {"assistant", "b"}}), {"messages[1]", "wants 'user'"});
  ExpectErrorContains(render("llama3", {}), {"\"messages\" is empty"});
  ExpectErrorContains(ChatTemplate::Builtin("vicuna").status(), {"unknown chat template 'vicuna'", "llama3"});
}

TEST(ChatTemplateTest, RecognizesTheModelsOwnTemplates) {
  const std::string llama3 =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' "
      "+ message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}...";
  EXPECT_EQ(*ChatTemplate::Recognize(llama3), "llama3");
  EXPECT_EQ(*ChatTemplate::Recognize("{{'<|im_start|>' + message['role'] + '\n'}}"), "chatml");
  EXPECT_EQ(*ChatTemplate::Recognize("<|im_start|>system\nYou are a helpful assistant.<|im_end|>"), "qwen2");
  EXPECT_EQ(*ChatTemplate::Recognize("{%- if tools %}<tool_call>{%- else %}<|im_start|>system\nYou are Qwen, "
                                     "created by Alibaba Cloud. You are a helpful assistant.<|im_end|>"),
            "qwen2.5");
  EXPECT_EQ(*ChatTemplate::Recognize("{{ bos_token }}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
                                     "{{ message['content'] + eos_token}}"),
            "mistral");
  EXPECT_EQ(*ChatTemplate::Recognize("[INST] {{ message['content'] + eos_token + ' ' }}"), "mistral-v0.1");
  EXPECT_EQ(*ChatTemplate::Recognize("{{ bos_token + '[INST] ' }}<<SYS>>\\n"), "llama2");
  ExpectErrorContains(ChatTemplate::Recognize("<|start_header_id|><|eot_id|>Cutting Knowledge Date: December 2023")
                          .status(),
                      {"Llama 3.1", "data.chat_template"});
  ExpectErrorContains(ChatTemplate::Recognize("<|im_start|>{% if enable_thinking %}<think>").status(),
                      {"thinking", "data.chat_template"});
  ExpectErrorContains(ChatTemplate::Recognize("[SYSTEM_PROMPT][INST]").status(), {"newer Mistral"});
  ExpectErrorContains(ChatTemplate::Recognize("<start_of_turn>user").status(),
                      {"none of the built-in formats", "llama3, chatml"});
}

TEST(ChatTemplateTest, PythonStripMatchesStrStrip) {
  EXPECT_EQ(PythonStrip("  a b \t\n"), "a b");
  EXPECT_EQ(PythonStrip("\xC2\xA0\xE3\x80\x80x\xE2\x80\xA8\x1f"), "x");  // NBSP, ideographic space, U+2028, \x1f
  EXPECT_EQ(PythonStrip("\xE2\x80\x8Bx"), "\xE2\x80\x8Bx");              // U+200B is not whitespace to Python
  EXPECT_EQ(PythonStrip(" \n "), "");
  EXPECT_EQ(PythonStrip("日本"), "日本");
}

TEST(EncodeWithCutsTest, CutsMapToTheTokenHoldingTheByte) {
  auto tok = tokenizer::Tokenizer::FromJsonText(ChatTokenizer().dump(), "chat tokenizer");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  std::vector<size_t> at;
  // "the hello": "the" → t + he, " hello" → Ġ + hello.
  auto ids = (*tok)->EncodeWithCuts("the hello", {0, 3, 4, 6, 9}, &at);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{'t', 257, ' ', kHello}));
  EXPECT_EQ(at, (std::vector<size_t>{0, 2, 3, 3, 4}));
  // A cut at an added token and inside one.
  ids = (*tok)->EncodeWithCuts("he<|eot_id|>hello", {2, 5, 12}, &at);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{257, kEot, kHello}));
  EXPECT_EQ(at, (std::vector<size_t>{1, 1, 2}));
  // No post-processor tokens (the template holds BOS).
  ids = (*tok)->EncodeWithCuts("hello", {}, &at);
  EXPECT_EQ(*ids, (std::vector<int32_t>{kHello}));
  EXPECT_FALSE((*tok)->EncodeWithCuts("\xff", {}, &at).ok());
}

class ChatDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer::testing::WriteJson(model_.path(), ChatTokenizer());
    Config(R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
               "chat_template": "{{ '<|start_header_id|>' }}{{ '<|eot_id|>' }}"})");
  }
  void Config(const std::string& text) { Write(model_ / "tokenizer_config.json", text); }
  static void Write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }
  std::string Data(const std::string& text) {
    Write(model_ / "data.jsonl", text);
    return model_ / "data.jsonl";
  }
  DataOptions Options() const {
    DataOptions o;
    o.model_dir = model_.path();
    o.format = "auto";
    o.vocab_size = kVocab;
    o.threads = 2;
    return o;
  }
  StatusOr<TokenDataset> Load(const std::string& text, DataOptions options) {
    path_ = Data(text);
    DatasetLoader loader(options, [this](const std::string& note) { notes_.push_back(note); });
    return loader.Load(path_);
  }
  StatusOr<TokenDataset> Load(const std::string& text) { return Load(text, Options()); }

  TempDir model_;
  std::string path_;
  std::vector<std::string> notes_;
};

const char* kHelloChat =
    R"({"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": " hello "}]})";

TEST_F(ChatDatasetTest, Llama3AssistantTurnsAreTrainedWithTheirEndOfTurn) {
  auto data = Load(std::string(kHelloChat) + "\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  ASSERT_EQ(data->examples.size(), 1u);
  const std::vector<int64_t> user_turn = Cat({{kBot, kStartHeader}, Bytes("user"), {kEndHeader, '\n', '\n', kHello, kEot}});
  const std::vector<int64_t> assistant_header = Cat({{kStartHeader}, Bytes("assistant"), {kEndHeader, '\n', '\n'}});
  EXPECT_EQ(data->examples[0].input_ids, Cat({user_turn, assistant_header, {kHello, kEot}}));
  EXPECT_EQ(data->examples[0].labels,
            Cat({Masked(user_turn.size() + assistant_header.size()), {kHello, kEot}}));
  EXPECT_NE(notes_.at(0).find("chat template llama3 (recognised"), std::string::npos) << notes_.at(0);

  DataOptions all = Options();
  all.train_on_prompt = true;
  auto everything = Load(std::string(kHelloChat) + "\n", all);
  ASSERT_TRUE(everything.ok());
  EXPECT_EQ(everything->examples[0].labels, everything->examples[0].input_ids);
}

TEST_F(ChatDatasetTest, ShareGptConversationsEqualMessages) {
  auto messages = Load(std::string(kHelloChat) + "\n");
  auto sharegpt = Load(
      R"({"conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": " hello "}]})"
      "\n");
  ASSERT_TRUE(messages.ok() && sharegpt.ok()) << sharegpt.status().message();
  EXPECT_EQ(messages->examples[0].input_ids, sharegpt->examples[0].input_ids);
  EXPECT_EQ(messages->examples[0].labels, sharegpt->examples[0].labels);
}

TEST_F(ChatDatasetTest, ChatmlFromAnExplicitTemplate) {
  DataOptions o = Options();
  o.format = "chat";
  o.chat_template = "chatml";
  auto data = Load(R"({"messages": [{"role": "user", "content": "he"}, {"role": "assistant", "content": "hello"}]})"
                   "\n",
                   o);
  ASSERT_TRUE(data.ok()) << data.status().message();
  const std::vector<int64_t> prompt =
      Cat({{kImStart}, Bytes("user"), {'\n', 257, kImEnd, '\n', kImStart}, Bytes("assistant"), {'\n'}});
  EXPECT_EQ(data->examples[0].input_ids, Cat({prompt, {kHello, kImEnd, '\n'}}));
  EXPECT_EQ(data->examples[0].labels, Cat({Masked(prompt.size()), {kHello, kImEnd, kM}}));
}

TEST_F(ChatDatasetTest, ConversationsWithoutAnAssistantTurnAreCountedAsDropped) {
  auto data = Load(std::string(kHelloChat) + "\n" + R"({"messages": [{"role": "user", "content": "hello"}]})" + "\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->lines, 2);
  EXPECT_EQ(data->examples.size(), 1u);
  EXPECT_EQ(data->dropped, 1);
  ExpectErrorContains(Load(R"({"messages": [{"role": "user", "content": "hello"}]})"
                           "\n")
                          .status(),
                      {"all 1 examples have nothing to train"});
}

TEST_F(ChatDatasetTest, BadLinesNameFileLineAndProblem) {
  const std::string ok = std::string(kHelloChat) + "\n";
  struct Case {
    std::string line;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {R"({"messages": {"role": "user"}})", {":2:", "\"messages\" must be a list, got an object"}},
      {R"({"messages": ["hi"]})", {":2:", "messages[0] must be an object, got a string"}},
      {R"({"messages": [{"role": "user"}]})", {":2:", "missing \"messages[0].content\""}},
      {R"({"messages": [{"role": "user", "content": 3}]})", {":2:", "\"messages[0].content\" must be a string"}},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", {":2:", "messages[0]: role 'robot'", "llama3"}},
      {R"({"conversations": [{"from": "bot", "value": "x"}]})", {":2:", "conversations[0].from is 'bot'"}},
      {R"({"messages": []})", {":2:", "\"messages\" is empty"}},
      {R"({"text": "not chat"})", {":2:", "missing \"messages\"", "conversations"}},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}", {":2:", "not valid UTF-8"}},
      {R"({"messages": [)", {":2:", "not valid JSON"}},
  };
  DataOptions o = Options();
  o.format = "chat";
  for (const Case& c : cases) {
    Status s = Load(ok + c.line + "\n", o).status();
    ASSERT_FALSE(s.ok()) << c.line;
    for (const std::string& part : c.parts) {
      EXPECT_NE(s.message().find(part), std::string::npos) << "message lacks \"" << part << "\": " << s.message();
    }
    EXPECT_NE(s.message().find(path_), std::string::npos) << s.message();
  }
}

TEST_F(ChatDatasetTest, TemplateChoiceErrorsSayWhatToDo) {
  Config(R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})");
  ExpectErrorContains(Load(std::string(kHelloChat) + "\n").status(),
                      {"has no chat template", "set data.chat_template to one of llama3"});
  Config(R"({"chat_template": "<start_of_turn>{{ messages }}"})");
  ExpectErrorContains(Load(std::string(kHelloChat) + "\n").status(),
                      {"data.chat_template auto", "none of the built-in formats"});
  // chat_template.jinja wins over tokenizer_config.json.
  Write(model_ / "chat_template.jinja", "{{ '<|im_start|>' }}");
  auto data = Load(std::string(kHelloChat) + "\n");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->examples[0].input_ids.front(), kImStart);
  // A template whose special tokens the tokenizer lacks belongs to another model.
  DataOptions o = Options();
  o.chat_template = "llama3";
  Config(R"({"eos_token": "<|eot_id|>"})");
  ExpectErrorContains(Load(std::string(kHelloChat) + "\n", o).status(),
                      {"data.chat_template llama3 needs the bos_token", "tokenizer_config.json"});
  json j = tokenizer::testing::ByteLevelBpe();
  tokenizer::testing::WriteJson(model_.path(), j);
  Config(R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|end|>"})");
  ExpectErrorContains(Load(std::string(kHelloChat) + "\n", o).status(),
                      {"'<|start_header_id|>' is not a token of", "is this template the model's?"});
}

TEST_F(ChatDatasetTest, ThreadCountDoesNotChangeTheResultAndErrorsKeepFileOrder) {
  std::string text;
  for (int i = 0; i < 3000; ++i) {
    text += R"({"messages": [{"role": "user", "content": "line )" + std::to_string(i) +
            R"("}, {"role": "assistant", "content": ")" + std::string(i % 7, 'l') + "hello\"}]}\n";
  }
  DataOptions one = Options(), many = Options();
  one.threads = 1;
  many.threads = 8;
  auto a = Load(text, one);
  auto b = Load(text, many);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->examples.size(), 3000u);
  for (size_t i = 0; i < a->examples.size(); ++i) {
    ASSERT_EQ(a->examples[i].input_ids, b->examples[i].input_ids) << i;
    ASSERT_EQ(a->examples[i].labels, b->examples[i].labels) << i;
  }
  // Two bad lines: the first in file order is reported, whichever thread met it.
  std::string bad = text + R"({"messages": 1})" + "\n";
  const size_t at = text.find('\n', text.size() / 2) + 1;
  const int64_t line = 1 + std::count(text.begin(), text.begin() + at, '\n');
  bad.insert(at, "{\"messages\": [{\"role\": 7}]}\n");
  ExpectErrorContains(Load(bad, many).status(), {":" + std::to_string(line) + ":", "messages[0].role"});
}

TEST_F(ChatDatasetTest, SecondLoadComesFromTheCacheAndAnyChangeMisses) {
  TempDir cache;
  DataOptions o = Options();
  o.cache_dir = cache.path();
  const std::string text = std::string(kHelloChat) + "\n";
  auto first = Load(text, o);
  ASSERT_TRUE(first.ok()) << first.status().message();
  ASSERT_FALSE(notes_.empty());
  EXPECT_NE(notes_.back().find("tokenized data.jsonl"), std::string::npos) << notes_.back();
  size_t files = 0;
  std::string cache_file;
  for (const auto& entry : std::filesystem::directory_iterator(cache.path())) {
    ++files;
    cache_file = entry.path().string();
  }
  EXPECT_EQ(files, 1u);

  auto second = Load(text, o);
  ASSERT_TRUE(second.ok());
  EXPECT_NE(notes_.back().find("from the tokenized cache"), std::string::npos) << notes_.back();
  EXPECT_EQ(second->examples[0].input_ids, first->examples[0].input_ids);
  EXPECT_EQ(second->examples[0].labels, first->examples[0].labels);
  EXPECT_EQ(second->lines, first->lines);

  // Each input is part of the key: a new cache file each time.
  DataOptions prompt = o;
  prompt.train_on_prompt = true;
  auto trained = Load(text, prompt);
  ASSERT_TRUE(trained.ok());
  EXPECT_NE(notes_.back().find("tokenized"), std::string::npos);
  EXPECT_EQ(trained->examples[0].labels, trained->examples[0].input_ids);
  DataOptions shorter = o;
  shorter.max_seq_len = 25;
  ASSERT_TRUE(Load(text, shorter).ok());
  EXPECT_NE(notes_.back().find("tokenized"), std::string::npos);
  ASSERT_TRUE(Load(std::string(kHelloChat) + "\n\n", o).ok());  // other bytes
  EXPECT_NE(notes_.back().find("tokenized"), std::string::npos);
  DataOptions chatml = o;
  chatml.chat_template = "chatml";
  ASSERT_TRUE(Load(text, chatml).ok());
  EXPECT_NE(notes_.back().find("tokenized"), std::string::npos);

  // A damaged cache file is noted and made again.
  {
    std::fstream f(cache_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(cache_file)) - 40);  // an example's bytes
    f.put('\x7f');
  }
  notes_.clear();
  auto again = Load(text, o);
  ASSERT_TRUE(again.ok());
  ASSERT_GE(notes_.size(), 2u);
  EXPECT_NE(notes_[notes_.size() - 2].find("is not used (damaged"), std::string::npos) << notes_[notes_.size() - 2];
  EXPECT_EQ(again->examples[0].input_ids, first->examples[0].input_ids);
  ASSERT_TRUE(Load(text, o).ok());
  EXPECT_NE(notes_.back().find("from the tokenized cache"), std::string::npos);
}

}  // namespace
}  // namespace trainerd::engine
