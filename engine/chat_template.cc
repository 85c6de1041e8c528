#include "engine/chat_template.h"

#include <string_view>
#include <utility>

#include "common/job_spec.h"
#include "engine/tokenizer/utf8.h"

namespace trainerd::engine {
namespace {

constexpr const char* kQwen2System = "You are a helpful assistant.";
constexpr const char* kQwen25System = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

bool IsPythonSpace(char32_t c) { return tokenizer::IsUnicodeWhiteSpace(c) || (c >= 0x1C && c <= 0x1F); }

bool Contains(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

std::string NamesList() {
  std::string out;
  for (const std::string& name : ChatTemplate::BuiltinNames()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

std::string At(size_t i) { return "messages[" + std::to_string(i) + "]"; }

}  // namespace

std::string PythonStrip(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end) {
    size_t len = 0;
    if (!IsPythonSpace(tokenizer::DecodeUtf8At(text, begin, &len))) break;
    begin += len;
  }
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    size_t len = 0;
    if (!IsPythonSpace(tokenizer::DecodeUtf8At(text, start, &len))) break;
    end = start;
  }
  return text.substr(begin, end - begin);
}

const std::vector<std::string>& ChatTemplate::BuiltinNames() { return BuiltinChatTemplateNames(); }

StatusOr<ChatTemplate> ChatTemplate::Builtin(const std::string& name) {
  if (name == "llama3") return ChatTemplate(name, Family::kLlama3, "", false);
  if (name == "chatml") return ChatTemplate(name, Family::kChatml, "", false);
  if (name == "qwen2") return ChatTemplate(name, Family::kChatml, kQwen2System, false);
  if (name == "qwen2.5") return ChatTemplate(name, Family::kChatml, kQwen25System, false);
  if (name == "mistral") return ChatTemplate(name, Family::kMistral, "", false);
  if (name == "mistral-v0.1") return ChatTemplate(name, Family::kMistral, "", true);
  if (name == "llama2") return ChatTemplate(name, Family::kLlama2, "", false);
  return Status::Error("unknown chat template '" + name + "': the built-in ones are " + NamesList());
}

StatusOr<std::string> ChatTemplate::Recognize(const std::string& t) {
  const std::string choose = "; set data.chat_template to one of " + NamesList() +
                             " if one of them is the format the model was trained with (docs/job-spec.md shows "
                             "each), or give the data as completion or tokens";
  if (Contains(t, "<|start_header_id|>") && Contains(t, "<|eot_id|>")) {
    if (Contains(t, "Cutting Knowledge Date") || Contains(t, "tools")) {
      return Status::Error(
          "the model's chat template is the Llama 3.1+ one (a system header with dates, tool calls), which "
          "trainerd does not render exactly; data.chat_template: llama3 renders the Llama 3.0 format (no date "
          "header)" + choose);
    }
    return std::string("llama3");
  }
  if (Contains(t, "<|im_start|>")) {
    // Qwen2.5's template also handles tool calls, but renders plain messages as ChatML.
    if (Contains(t, kQwen25System) && !Contains(t, "<think>")) return std::string("qwen2.5");
    if (Contains(t, "<think>") || Contains(t, "tool_call")) {
      return Status::Error("the model's chat template is a ChatML variant with tool calls or thinking "
                           "blocks, which trainerd does not render exactly" + choose);
    }
    if (Contains(t, kQwen2System)) return std::string("qwen2");
    return std::string("chatml");
  }
  if (Contains(t, "[INST]")) {
    if (Contains(t, "[SYSTEM_PROMPT]") || Contains(t, "[AVAILABLE_TOOLS]") || Contains(t, "[TOOL_CALLS]")) {
      return Status::Error("the model's chat template is a newer Mistral one (control tokens for system "
                           "prompts or tools), which trainerd does not render exactly" + choose);
    }
    if (Contains(t, "<<SYS>>")) return std::string("llama2");
    if (Contains(t, "eos_token + ' '")) return std::string("mistral-v0.1");
    return std::string("mistral");
  }
  return Status::Error("the model's chat template is none of the built-in formats" + choose);
}

std::vector<std::string> ChatTemplate::RequiredTokens() const {
  switch (family_) {
    case Family::kLlama3:
      return {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    case Family::kChatml:
      return {"<|im_start|>", "<|im_end|>"};
    case Family::kMistral:
    case Family::kLlama2:
      return {};
  }
  return {};
}

bool ChatTemplate::uses_bos() const { return family_ != Family::kChatml; }
bool ChatTemplate::uses_eos() const { return family_ == Family::kMistral || family_ == Family::kLlama2; }

StatusOr<std::vector<ChatPiece>> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                      const std::string& bos, const std::string& eos) const {
  if (messages.empty()) return Status::Error("\"messages\" is empty: a conversation needs at least one message");
  std::vector<ChatPiece> out;
  // Adjacent pieces of the same kind are merged, so the result alternates.
  auto emit = [&out](std::string text, bool assistant) {
    if (text.empty()) return;
    if (!out.empty() && out.back().assistant == assistant) {
      out.back().text += text;
    } else {
      out.push_back({std::move(text), assistant});
    }
  };
  auto known_role = [&](size_t i, std::initializer_list<const char*> roles) -> Status {
    std::string list;
    for (const char* r : roles) {
      if (messages[i].role == r) return Status::Ok();
      list += (list.empty() ? "" : ", ") + std::string(r);
    }
    return Status::Error(At(i) + ": role '" + messages[i].role + "' is not one the " + name_ +
                         " template knows (" + list + ")");
  };
  auto system_first = [&](size_t i) -> Status {
    if (messages[i].role == "system" && i != 0) {
      return Status::Error(At(i) + ": a system message must be the first message (the " + name_ +
                           " template puts it first)");
    }
    return Status::Ok();
  };

  switch (family_) {
    case Family::kLlama3:
      emit(bos, false);
      for (size_t i = 0; i < messages.size(); ++i) {
        TRAINERD_RETURN_IF_ERROR(known_role(i, {"system", "user", "assistant", "ipython"}));
        TRAINERD_RETURN_IF_ERROR(system_first(i));
        const bool assistant = messages[i].role == "assistant";
        emit("<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n", false);
        emit(PythonStrip(messages[i].content) + "<|eot_id|>", assistant);
      }
      break;
    case Family::kChatml:
      for (size_t i = 0; i < messages.size(); ++i) {
        TRAINERD_RETURN_IF_ERROR(known_role(i, {"system", "user", "assistant"}));
        TRAINERD_RETURN_IF_ERROR(system_first(i));
        if (i == 0 && messages[0].role != "system" && !default_system_.empty()) {
          emit("<|im_start|>system\n" + default_system_ + "<|im_end|>\n", false);
        }
        const bool assistant = messages[i].role == "assistant";
        emit("<|im_start|>" + messages[i].role + "\n", false);
        emit(messages[i].content + "<|im_end|>", assistant);
        emit("\n", false);
      }
      break;
    case Family::kMistral:
      emit(bos, false);
      for (size_t i = 0; i < messages.size(); ++i) {
        TRAINERD_RETURN_IF_ERROR(known_role(i, {"user", "assistant"}));
        const char* want = i % 2 == 0 ? "user" : "assistant";
        if (messages[i].role != want) {
          return Status::Error(At(i) + ": role '" + messages[i].role + "' where the " + name_ +
                               " template wants '" + want + "' (turns alternate user/assistant, user first)");
        }
        if (messages[i].role == "user") {
          emit("[INST] " + messages[i].content + " [/INST]", false);
        } else {
          emit(messages[i].content + eos, true);
          if (space_after_eos_) emit(" ", false);
        }
      }
      break;
    case Family::kLlama2: {
      size_t first = 0;
      std::string system;
      bool has_system = false;
      if (messages[0].role == "system") {
        system = messages[0].content;
        has_system = true;
        first = 1;
      }
      for (size_t i = first; i < messages.size(); ++i) {
        TRAINERD_RETURN_IF_ERROR(known_role(i, {"system", "user", "assistant"}));
        const char* want = (i - first) % 2 == 0 ? "user" : "assistant";
        if (messages[i].role != want) {
          return Status::Error(At(i) + ": role '" + messages[i].role + "' where the " + name_ +
                               " template wants '" + want +
                               "' (an optional system message first, then user/assistant turns alternating)");
        }
        std::string content = messages[i].content;
        if (i == first && has_system) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
        if (messages[i].role == "user") {
          emit(bos + "[INST] " + PythonStrip(content) + " [/INST]", false);
        } else {
          emit(" ", false);
          emit(PythonStrip(content) + " " + eos, true);
        }
      }
      break;
    }
  }
  return out;
}

}  // namespace trainerd::engine
