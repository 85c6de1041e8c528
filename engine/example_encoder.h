// One JSONL line of a text data format → a TokenExample (ids and labels).
// Torch-free and thread-safe: one encoder serves every tokenizing thread.
//
//   text:       {"text": s}                   ids = Encode(s) + EOS, every token trained
//   completion: {"prompt": p, "completion": c}
//               ids = Encode(p + c) + EOS; the first len(Encode(p)) ids are the
//               prompt (label -100) unless train_on_prompt; EOS is always trained
//   chat:       {"messages": [{"role": r, "content": c}, ...]} or ShareGPT's
//               {"conversations": [{"from": f, "value": v}, ...]} (from: human →
//               user, gpt → assistant, system; also user/assistant)
//               ids = the chat template's rendering (engine/chat_template.h)
//               tokenized as apply_chat_template does (no post-processor
//               tokens: the template holds BOS); only assistant pieces are
//               trained unless train_on_prompt. No EOS is added: each
//               assistant turn ends with the template's end-of-turn token.
//
// Encode is the model's tokenizer.json with the post-processor's special tokens
// (Hugging Face's encode default), as TRL's SFTTrainer and axolotl tokenize.
// The prompt/completion boundary is the number of ids of Encode(p) on its own,
// special tokens included (TRL's rule), even where a token of Encode(p + c)
// spans the boundary. EOS is not appended when the ids already end with it.
// A chat token is trained when it holds any byte of an assistant piece
// (Tokenizer::EncodeWithCuts), as Hugging Face's assistant-token mask.
// Other fields on a line are ignored.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "engine/chat_template.h"
#include "engine/token_dataset.h"
#include "engine/tokenizer/tokenizer.h"

namespace trainerd::engine {

struct EncoderSetup {
  std::string format;  // text | completion | chat
  const tokenizer::Tokenizer* tokenizer = nullptr;
  int32_t eos_id = -1;      // appended to text and completion examples
  int64_t vocab_size = 0;   // the model's: every id must be below it
  bool train_on_prompt = false;
  const ChatTemplate* chat_template = nullptr;  // chat only
  std::string bos_token, eos_token;             // chat: the template's bos_token / eos_token
};

class ExampleEncoder {
 public:
  explicit ExampleEncoder(EncoderSetup setup);

  // Errors name `where` (file:line) and what is wrong: malformed JSON, invalid
  // UTF-8, a missing field, a field of the wrong type, a role the template
  // does not know, an id outside the model's vocabulary.
  StatusOr<TokenExample> Encode(const std::string& line, const std::string& where) const;

 private:
  StatusOr<TokenExample> EncodeChat(const nlohmann::json& j, const std::string& where) const;
  EncoderSetup setup_;
};

}  // namespace trainerd::engine
