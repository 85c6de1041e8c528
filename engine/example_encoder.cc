#include "engine/example_encoder.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/jsonl.h"

namespace trainerd::engine {
namespace {

using nlohmann::json;

Status CheckIds(const std::vector<int32_t>& ids, const std::string& where, int64_t vocab_size) {
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size) {
      return Status::Error(where + ": the tokenizer gave id " + std::to_string(id) +
                           ", outside the model's vocabulary [0, " + std::to_string(vocab_size) +
                           "); is tokenizer.json the model's own?");
    }
  }
  return Status::Ok();
}

// Encode `text` with special tokens, checked against the model's vocabulary.
StatusOr<std::vector<int64_t>> EncodeChecked(const tokenizer::Tokenizer& tok, const std::string& text,
                                             const char* field, const std::string& where, int64_t vocab_size) {
  StatusOr<std::vector<int32_t>> ids = tok.Encode(text, /*add_special_tokens=*/true);
  if (!ids.ok()) return Status::Error(where + ": \"" + field + "\": " + ids.status().message());
  TRAINERD_RETURN_IF_ERROR(CheckIds(*ids, where, vocab_size));
  return std::vector<int64_t>(ids->begin(), ids->end());
}

// The messages of a chat line: OpenAI-style "messages" or ShareGPT "conversations".
StatusOr<std::vector<ChatMessage>> ReadConversation(const json& j, const std::string& where) {
  const bool sharegpt = !j.contains("messages") && j.contains("conversations");
  const std::string list = sharegpt ? "conversations" : "messages";
  const char* shape = sharegpt ? "{\"conversations\": [{\"from\": \"human\", \"value\": \"...\"}, ...]}"
                               : "{\"messages\": [{\"role\": \"user\", \"content\": \"...\"}, ...]}";
  const auto it = j.find(list);
  if (it == j.end()) {
    return Status::Error(where + ": missing \"messages\" (data.format chat wants " + std::string(shape) +
                         " or ShareGPT's {\"conversations\": [{\"from\", \"value\"}]}; found: " + KeyList(j) + ")");
  }
  if (!it->is_array()) return Status::Error(where + ": \"" + list + "\" must be a list, got " + JsonKind(*it));
  std::vector<ChatMessage> messages;
  messages.reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string at = list + "[" + std::to_string(i) + "]";
    if (!m.is_object()) return Status::Error(where + ": " + at + " must be an object, got " + JsonKind(m));
    ChatMessage message;
    if (sharegpt) {
      TRAINERD_ASSIGN_OR_RETURN(std::string from, StringField(m, "from", where, shape, at + "."));
      TRAINERD_ASSIGN_OR_RETURN(message.content, StringField(m, "value", where, shape, at + "."));
      if (from == "human" || from == "user") {
        message.role = "user";
      } else if (from == "gpt" || from == "assistant") {
        message.role = "assistant";
      } else if (from == "system") {
        message.role = "system";
      } else {
        return Status::Error(where + ": " + at + ".from is '" + from +
                             "'; ShareGPT conversations know human, gpt and system (also user and assistant)");
      }
    } else {
      TRAINERD_ASSIGN_OR_RETURN(message.role, StringField(m, "role", where, shape, at + "."));
      TRAINERD_ASSIGN_OR_RETURN(message.content, StringField(m, "content", where, shape, at + "."));
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

}  // namespace

ExampleEncoder::ExampleEncoder(EncoderSetup setup) : setup_(std::move(setup)) {}

StatusOr<TokenExample> ExampleEncoder::Encode(const std::string& line, const std::string& where) const {
  TRAINERD_ASSIGN_OR_RETURN(json j, ParseObjectLine(line, where));
  if (setup_.format == "chat") return EncodeChat(j, where);
  const tokenizer::Tokenizer& tok = *setup_.tokenizer;
  TokenExample ex;
  size_t prompt_len = 0;  // leading ids that are not trained
  if (setup_.format == "completion") {
    const char* shape = "{\"prompt\": \"...\", \"completion\": \"...\"}";
    TRAINERD_ASSIGN_OR_RETURN(std::string prompt, StringField(j, "prompt", where, shape));
    TRAINERD_ASSIGN_OR_RETURN(std::string answer, StringField(j, "completion", where, shape));
    TRAINERD_ASSIGN_OR_RETURN(ex.input_ids,
                              EncodeChecked(tok, prompt + answer, "prompt + completion", where, setup_.vocab_size));
    if (!setup_.train_on_prompt) {
      TRAINERD_ASSIGN_OR_RETURN(std::vector<int64_t> prompt_ids,
                                EncodeChecked(tok, prompt, "prompt", where, setup_.vocab_size));
      prompt_len = std::min(prompt_ids.size(), ex.input_ids.size());
    }
  } else if (setup_.format == "text") {
    TRAINERD_ASSIGN_OR_RETURN(std::string text, StringField(j, "text", where, "{\"text\": \"...\"}"));
    TRAINERD_ASSIGN_OR_RETURN(ex.input_ids, EncodeChecked(tok, text, "text", where, setup_.vocab_size));
  } else {
    return Status::Error(where + ": unknown text data format '" + setup_.format + "'");
  }
  if (ex.input_ids.empty() || ex.input_ids.back() != setup_.eos_id) ex.input_ids.push_back(setup_.eos_id);
  ex.labels = ex.input_ids;
  // The prompt never covers the final EOS, which is always trained.
  prompt_len = std::min(prompt_len, ex.labels.size() - 1);
  for (size_t i = 0; i < prompt_len; ++i) ex.labels[i] = kIgnoreIndex;
  return ex;
}

StatusOr<TokenExample> ExampleEncoder::EncodeChat(const json& j, const std::string& where) const {
  TRAINERD_ASSIGN_OR_RETURN(std::vector<ChatMessage> messages, ReadConversation(j, where));
  StatusOr<std::vector<ChatPiece>> pieces = setup_.chat_template->Render(messages, setup_.bos_token, setup_.eos_token);
  if (!pieces.ok()) {
    return Status::Error(where + ": " + pieces.status().message() + " (data.chat_template " +
                         setup_.chat_template->name() + ")");
  }
  std::string text;
  std::vector<size_t> cuts;  // byte offsets where a piece starts, after the first
  for (const ChatPiece& piece : *pieces) {
    if (!text.empty()) cuts.push_back(text.size());
    text += piece.text;
  }
  std::vector<size_t> cut_tokens;
  StatusOr<std::vector<int32_t>> ids = setup_.tokenizer->EncodeWithCuts(text, cuts, &cut_tokens);
  if (!ids.ok()) return Status::Error(where + ": " + ids.status().message());
  TRAINERD_RETURN_IF_ERROR(CheckIds(*ids, where, setup_.vocab_size));
  TokenExample ex;
  ex.input_ids.assign(ids->begin(), ids->end());
  ex.labels = ex.input_ids;
  if (!setup_.train_on_prompt) {
    // Piece k spans tokens [cut_tokens[k-1], cut_tokens[k]). A token holding
    // the end of a non-assistant piece and the start of an assistant one is
    // the assistant piece's first (EncodeWithCuts). Assistant pieces end with
    // an added token in every built-in template, so their end is exact.
    size_t start = 0;
    for (size_t k = 0; k < pieces->size(); ++k) {
      const size_t end = k < cut_tokens.size() ? cut_tokens[k] : ex.labels.size();
      if (!(*pieces)[k].assistant) {
        for (size_t t = start; t < end; ++t) ex.labels[t] = kIgnoreIndex;
      }
      start = end;
    }
  }
  return ex;
}

}  // namespace trainerd::engine
