// Chat templates built into trainerd: a conversation (role, content messages)
// rendered as the text the model's own Jinja chat template
// (tokenizer_config.json "chat_template", applied by transformers'
// apply_chat_template) produces, cut into pieces that say which text is
// assistant output, so only assistant turns and their end-of-turn token are
// trained. Torch-free.
//
// The templates, with `b`/`e` the tokenizer_config.json bos_token/eos_token
// (each message's content as given unless noted):
//   llama3        b + for each message: "<|start_header_id|>" role "<|end_header_id|>\n\n" strip(content) "<|eot_id|>"
//                 (Meta-Llama-3-Instruct; roles system, user, assistant, ipython)
//   chatml        for each: "<|im_start|>" role "\n" content "<|im_end|>\n"
//   qwen2         chatml, with "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" first
//                 when the conversation has no system message (Qwen2-Instruct)
//   qwen2.5       likewise with "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
//   mistral       b, then user: "[INST] " content " [/INST]", assistant: content e
//                 (Mistral-7B-Instruct-v0.2, Mixtral-8x7B-Instruct; no system role)
//   mistral-v0.1  as mistral with a space after e (Mistral-7B-Instruct-v0.1)
//   llama2        optional system s folded into the first user turn as "<<SYS>>\n" s "\n<</SYS>>\n\n" content;
//                 user: b "[INST] " strip(content) " [/INST]", assistant: " " strip(content) " " e (Llama-2-chat)
// The [INST] templates want user and assistant turns alternating, user first.
// strip() removes leading and trailing whitespace as Python's str.strip does.
// Trained pieces: an assistant message's content (after strip) through its
// end-of-turn token ("<|eot_id|>", "<|im_end|>", e), the text Hugging Face's
// {% generation %} marks in TRL's assistant-only training.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace trainerd::engine {

struct ChatMessage {
  std::string role;  // system, user, assistant (ShareGPT's human/gpt mapped by the reader)
  std::string content;
};

struct ChatPiece {
  std::string text;
  bool assistant = false;  // assistant output: trained unless data.train_on_prompt
};

class ChatTemplate {
 public:
  // One of BuiltinNames(); an unknown name is an error listing them.
  static StatusOr<ChatTemplate> Builtin(const std::string& name);
  static const std::vector<std::string>& BuiltinNames();

  // The built-in template equal to the Jinja `chat_template` text of a
  // tokenizer_config.json, recognised by the markers each family's templates
  // carry. Templates we do not reproduce exactly (Llama 3.1's date header and
  // tools, Qwen3's thinking, Mistral's v3 control tokens, ...) and unknown ones
  // are errors that say to set data.chat_template.
  static StatusOr<std::string> Recognize(const std::string& jinja_template);

  const std::string& name() const { return name_; }

  // The special tokens the template's text contains (besides bos/eos), which
  // must be added tokens of the tokenizer: otherwise the template does not
  // belong to the model.
  std::vector<std::string> RequiredTokens() const;
  bool uses_bos() const;
  bool uses_eos() const;

  // Renders `messages`. A role the template does not know, a system message
  // anywhere but first, or turns out of order for the [INST] templates are
  // errors naming the message ("messages[2]: ...").
  StatusOr<std::vector<ChatPiece>> Render(const std::vector<ChatMessage>& messages, const std::string& bos_token,
                                          const std::string& eos_token) const;

 private:
  enum class Family { kLlama3, kChatml, kMistral, kLlama2 };
  ChatTemplate(std::string name, Family family, std::string default_system, bool space_after_eos)
      : name_(std::move(name)),
        family_(family),
        default_system_(std::move(default_system)),
        space_after_eos_(space_after_eos) {}

  std::string name_;
  Family family_;
  std::string default_system_;  // chatml family: the system message used when there is none
  bool space_after_eos_;        // mistral-v0.1
};

// Python's str.strip(): removes leading and trailing characters that are
// whitespace to Python (ASCII spaces and controls \t\n\v\f\r\x1c-\x1f, U+0085,
// U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000).
std::string PythonStrip(const std::string& text);

}  // namespace trainerd::engine
