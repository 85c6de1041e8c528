// Parity with transformers' apply_chat_template on fixtures it generated
// (tools/make_chat_fixtures.py): tests/fixtures/chat/NAME/ is a model folder
// (tokenizer.json, tokenizer_config.json with the model's own Jinja template,
// or chat_template.jinja) with chats.jsonl {"messages"} and expected.jsonl
// {"input_ids", "assistant_masks"}. The folder name is the built-in template
// that data.chat_template auto must recognise. Loading chats.jsonl as chat data
// must give exactly those ids, with labels on the masked (assistant) tokens
// only; train_on_prompt trains every token; ShareGPT's form of the same
// conversations gives the same examples.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/text_dataset.h"
#include "tests/read_jsonl.h"
#include "tests/temp_dir.h"

namespace trainerd::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using trainerd::testing::ReadJsonl;

StatusOr<TokenDataset> LoadChat(const fs::path& model, const std::string& data, bool train_on_prompt,
                                std::vector<std::string>* notes) {
  auto tok = tokenizer::Tokenizer::FromFile(model.string());
  if (!tok.ok()) return tok.status();
  DataOptions o;
  o.model_dir = model.string();
  o.format = "auto";
  o.vocab_size = (*tok)->vocab_size();
  o.max_seq_len = 1 << 20;
  o.train_on_prompt = train_on_prompt;
  DatasetLoader loader(o, [notes](const std::string& n) { notes->push_back(n); });
  return loader.Load(data);
}

TEST(ChatParityTest, MatchesApplyChatTemplateOnEveryFixture) {
  const fs::path root = fs::path(TRAINERD_FIXTURES) / "chat";
  if (!fs::is_directory(root)) GTEST_SKIP() << "no chat fixtures yet: " << root << " does not exist";
  int fixtures = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (!entry.is_directory()) continue;
    const fs::path dir = entry.path();
    const std::string name = dir.filename().string();
    SCOPED_TRACE(dir.string());
    ++fixtures;
    const auto chats = ReadJsonl(dir / "chats.jsonl");
    const auto expected = ReadJsonl(dir / "expected.jsonl");
    ASSERT_EQ(chats.size(), expected.size());

    std::vector<std::string> notes;
    auto masked = LoadChat(dir, (dir / "chats.jsonl").string(), false, &notes);
    ASSERT_TRUE(masked.ok()) << masked.status().message();
    ASSERT_FALSE(notes.empty());
    EXPECT_NE(notes[0].find("chat template " + name + " (recognised"), std::string::npos) << notes[0];
    auto all = LoadChat(dir, (dir / "chats.jsonl").string(), true, &notes);
    ASSERT_TRUE(all.ok()) << all.status().message();
    ASSERT_EQ(all->examples.size(), chats.size());

    size_t kept = 0;
    int64_t dropped = 0;
    int mismatches = 0;
    for (size_t i = 0; i < chats.size() && mismatches < 5; ++i) {
      const auto ids = expected[i].at("input_ids").get<std::vector<int64_t>>();
      const auto mask = expected[i].at("assistant_masks").get<std::vector<int>>();
      std::vector<int64_t> labels(ids.size(), kIgnoreIndex);
      bool trains = false;
      for (size_t t = 0; t < ids.size(); ++t) {
        if (mask.at(t)) labels[t] = ids[t];
        trains |= t > 0 && mask[t];
      }
      if (all->examples[i].input_ids != ids) {
        ++mismatches;
        ADD_FAILURE() << "line " << i + 1 << ": ids differ from apply_chat_template for " << chats[i].dump()
                      << "\n  want " << json(ids).dump() << "\n  got  " << json(all->examples[i].input_ids).dump();
        continue;
      }
      EXPECT_EQ(all->examples[i].labels, ids) << "line " << i + 1 << ": train_on_prompt trains every token";
      if (!trains) {
        ++dropped;
        continue;
      }
      ASSERT_LT(kept, masked->examples.size());
      if (masked->examples[kept].labels != labels) {
        ++mismatches;
        ADD_FAILURE() << "line " << i + 1 << ": trained tokens differ from the assistant mask for "
                      << chats[i].dump() << "\n  want " << json(labels).dump() << "\n  got  "
                      << json(masked->examples[kept].labels).dump();
      }
      ++kept;
    }
    if (mismatches) continue;
    EXPECT_EQ(kept, masked->examples.size());
    EXPECT_EQ(dropped, masked->dropped);

    // The same conversations in ShareGPT's form.
    testing::TempDir tmp;
    {
      std::ofstream out(tmp / "sharegpt.jsonl");
      for (const json& chat : chats) {
        json conversation = json::array();
        for (const json& m : chat.at("messages")) {
          const std::string role = m.at("role").get<std::string>();
          conversation.push_back(
              {{"from", role == "user" ? "human" : role == "assistant" ? "gpt" : role}, {"value", m.at("content")}});
        }
        out << json{{"conversations", conversation}}.dump() << "\n";
      }
    }
    auto sharegpt = LoadChat(dir, tmp / "sharegpt.jsonl", false, &notes);
    ASSERT_TRUE(sharegpt.ok()) << sharegpt.status().message();
    ASSERT_EQ(sharegpt->examples.size(), masked->examples.size());
    for (size_t k = 0; k < masked->examples.size(); ++k) {
      EXPECT_EQ(sharegpt->examples[k].input_ids, masked->examples[k].input_ids);
      EXPECT_EQ(sharegpt->examples[k].labels, masked->examples[k].labels);
    }
  }
  if (fixtures == 0) GTEST_SKIP() << root << " has no fixture folders yet";
}

}  // namespace
}  // namespace trainerd::engine
