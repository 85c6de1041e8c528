// A fine-tune on chat data end to end through RunJob: a model folder with a
// real chat tokenizer (tests/fixtures/chat/llama3) and a Llama of matching
// vocabulary, the template recognised from tokenizer_config.json, packing,
// and the second run taking its data from the tokenized cache.
#include <cmath>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/model_config.h"
#include "engine/tensor_io.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/engine/test_support.h"

namespace trainerd::testing {
namespace {

// tests/fixtures/llama/model with embed_tokens and lm_head widened (seeded
// random rows) to the chat tokenizer's vocabulary, plus that tokenizer.
std::string ChatModel(const TempDir& tmp) {
  const std::string dir = tmp / "model";
  fs::create_directories(dir);
  const std::string chat = Fixture("chat/llama3");
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    std::ifstream from(chat + "/" + name, std::ios::binary);
    std::ofstream(dir + "/" + name, std::ios::binary) << from.rdbuf();
  }
  auto tok = engine::tokenizer::Tokenizer::FromFile(chat);
  EXPECT_TRUE(tok.ok());
  const int64_t vocab = (*tok)->vocab_size();
  std::ifstream in(Fixture("llama/model/config.json"));
  nlohmann::json config = nlohmann::json::parse(in);
  config["vocab_size"] = vocab;
  config["bos_token_id"] = *(*tok)->TokenToId("<|begin_of_text|>");
  config["eos_token_id"] = *(*tok)->TokenToId("<|eot_id|>");
  WriteText(dir + "/config.json", config.dump(2));
  auto weights = engine::LoadModelWeights(Fixture("llama/model"), torch::kFloat32, torch::kCPU);
  EXPECT_TRUE(weights.ok());
  torch::manual_seed(3);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto& [name, t] : *weights) {
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
      t = torch::randn({vocab, t.size(1)}) * 0.02;
    }
    tensors.emplace_back(name, t);
  }
  EXPECT_TRUE(engine::WriteTorchSafetensors(dir + "/model.safetensors", tensors).ok());
  return dir;
}

TEST(ChatRun, FineTunesOnChatDataAndReusesTheTokenizedCache) {
  TempDir tmp;
  const std::string model = ChatModel(tmp);
  const std::string yaml = "model: {path: " + model + ", dtype: float32}\nadapter: {r: 4}\n"
                           "data: {train: " + Fixture("chat/llama3/chats.jsonl") +
                           ", format: auto, packing: true, max_seq_len: 512, cache_dir: " + (tmp / "cache") +
                           "}\ntraining: {max_steps: 3, micro_batch_size: 2}\n"
                           "output: {dir: " + (tmp / "out") + "}\ndevice: cpu\n";
  RecordingReporter first;
  auto result = engine::RunJob(SpecFromYaml(yaml, tmp.path()), {}, first);
  ASSERT_TRUE(result.ok()) << result.status().message();
  std::string notes;
  for (const std::string& m : first.messages) notes += m + "\n";
  EXPECT_NE(notes.find("chat template llama3 (recognised"), std::string::npos) << notes;
  EXPECT_NE(notes.find("tokenized chats.jsonl"), std::string::npos) << notes;
  EXPECT_GT(first.info.trained_tokens, 0);
  EXPECT_LT(first.info.trained_tokens, first.info.train_tokens);  // prompts are masked
  ASSERT_EQ(first.progress.size(), 3u);
  for (const auto& p : first.progress) EXPECT_TRUE(std::isfinite(p.loss)) << p.loss;
  EXPECT_TRUE(fs::exists(tmp / "out/adapter/adapter_model.safetensors"));

  RecordingReporter second;
  ASSERT_TRUE(engine::RemoveTree(tmp / "out").ok());
  result = engine::RunJob(SpecFromYaml(yaml, tmp.path()), {}, second);
  ASSERT_TRUE(result.ok()) << result.status().message();
  notes.clear();
  for (const std::string& m : second.messages) notes += m + "\n";
  EXPECT_NE(notes.find("chats.jsonl from the tokenized cache"), std::string::npos) << notes;
  EXPECT_EQ(second.info.train_tokens, first.info.train_tokens);
  EXPECT_EQ(second.info.trained_tokens, first.info.trained_tokens);
  ASSERT_EQ(second.progress.size(), 3u);
  EXPECT_EQ(second.progress[0].loss, first.progress[0].loss);
}

}  // namespace
}  // namespace trainerd::testing
