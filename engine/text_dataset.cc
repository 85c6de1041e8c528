#include "engine/text_dataset.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/utf8.h"

namespace trainerd::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// "a number", "a list", ... for "got ..." in messages.
std::string JsonKind(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return "a number";
    case json::value_t::array:
      return "a list";
    case json::value_t::object:
      return "an object";
    case json::value_t::string:
      return "a string";
    default:
      return "something else";
  }
}

bool IsBlank(const std::string& line) { return line.find_first_not_of(" \t\r") == std::string::npos; }

// One non-blank line parsed as a JSON object; errors name `where` (file:line).
StatusOr<json> ParseObjectLine(const std::string& line, const std::string& where) {
  if (size_t bad = tokenizer::FindInvalidUtf8(line); bad != std::string::npos) {
    return Status::Error(where + ": not valid UTF-8 at byte offset " + std::to_string(bad) +
                         " of the line (data files must be UTF-8)");
  }
  json j;
  try {
    j = json::parse(line);
  } catch (const json::parse_error& e) {
    return Status::Error(where + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object()) return Status::Error(where + ": expected a JSON object, got " + JsonKind(j));
  return j;
}

std::string KeyList(const json& j) {
  std::string out;
  for (const auto& [key, _] : j.items()) out += (out.empty() ? "" : ", ") + key;
  return out.empty() ? "none" : out;
}

// The string field `key` of line object `j`.
StatusOr<std::string> StringField(const json& j, const char* key, const std::string& where, const char* format,
                                  const char* shape) {
  const auto it = j.find(key);
  if (it == j.end()) {
    return Status::Error(where + ": missing \"" + key + "\" (data.format " + format + " wants " + shape +
                         "; the line has: " + KeyList(j) + ")");
  }
  if (!it->is_string()) {
    return Status::Error(where + ": \"" + key + "\" must be a string, got " + JsonKind(*it));
  }
  return it->get<std::string>();
}

// Encode `text` with special tokens, checked against the model's vocabulary.
StatusOr<std::vector<int64_t>> EncodeChecked(const tokenizer::Tokenizer& tok, const std::string& text,
                                             const char* field, const std::string& where, int64_t vocab_size) {
  StatusOr<std::vector<int32_t>> ids = tok.Encode(text, /*add_special_tokens=*/true);
  if (!ids.ok()) return Status::Error(where + ": \"" + field + "\": " + ids.status().message());
  std::vector<int64_t> out(ids->begin(), ids->end());
  for (int64_t id : out) {
    if (id < 0 || id >= vocab_size) {
      return Status::Error(where + ": the tokenizer gave id " + std::to_string(id) +
                           ", outside the model's vocabulary [0, " + std::to_string(vocab_size) +
                           "); is tokenizer.json the model's own?");
    }
  }
  return out;
}

// Reads an optional JSON file of the model folder; nullopt when it is absent.
StatusOr<std::optional<json>> ReadOptionalJson(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::optional<json>();
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot open for reading");
  std::ostringstream content;
  content << in.rdbuf();
  try {
    return std::optional<json>(json::parse(content.str()));
  } catch (const json::exception& e) {
    return Status::Error(path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
}

// eos_token_id of config.json or generation_config.json: an integer or a list
// whose first entry is used; nullopt when absent or null.
StatusOr<std::optional<int32_t>> EosIdFrom(const std::string& path) {
  TRAINERD_ASSIGN_OR_RETURN(std::optional<json> j, ReadOptionalJson(path));
  if (!j || !j->is_object()) return std::optional<int32_t>();
  const auto it = j->find("eos_token_id");
  if (it == j->end() || it->is_null()) return std::optional<int32_t>();
  const json* v = &*it;
  if (v->is_array()) {
    if (v->empty()) return std::optional<int32_t>();
    v = &(*v)[0];
  }
  if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > INT32_MAX) {
    return Status::Error(path + ": eos_token_id must be a non-negative integer or a list of them, got " +
                         it->dump());
  }
  return std::optional<int32_t>(static_cast<int32_t>(v->get<int64_t>()));
}

}  // namespace

StatusOr<std::string> DetectDataFormat(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot open the data file");
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (IsBlank(line)) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    TRAINERD_ASSIGN_OR_RETURN(json j, ParseObjectLine(line, where));
    if (j.contains("input_ids")) return std::string("tokens");
    if (j.contains("text")) return std::string("text");
    if (j.contains("prompt") && j.contains("completion")) return std::string("completion");
    if (j.contains("messages") || j.contains("conversations")) {
      return Status::Error(where + ": this looks like chat data (\"" +
                           std::string(j.contains("messages") ? "messages" : "conversations") +
                           "\"); chat datasets come with a later version: use data.format text or "
                           "completion, or pre-tokenized tokens");
    }
    return Status::Error(where + ": cannot tell the data format from the fields (" + KeyList(j) +
                         "): data.format auto knows input_ids (tokens), text (text) and prompt + "
                         "completion (completion)");
  }
  if (in.bad()) return Status::Error(path + ": read error");
  return Status::Error(path + ": the data file is empty");
}

StatusOr<int32_t> FindEosTokenId(const std::string& model_dir, const tokenizer::Tokenizer& tokenizer) {
  const std::string config_path = (fs::path(model_dir) / "tokenizer_config.json").string();
  TRAINERD_ASSIGN_OR_RETURN(std::optional<json> config, ReadOptionalJson(config_path));
  if (config && config->is_object()) {
    const auto it = config->find("eos_token");
    if (it != config->end() && !it->is_null()) {
      const json* content = &*it;
      if (it->is_object()) {
        const auto c = it->find("content");
        if (c == it->end()) return Status::Error(config_path + ": eos_token is an object without \"content\"");
        content = &*c;
      }
      if (!content->is_string()) {
        return Status::Error(config_path + ": eos_token must be a string or {\"content\": ...}, got " + it->dump());
      }
      const std::string token = content->get<std::string>();
      if (std::optional<int32_t> id = tokenizer.TokenToId(token)) return *id;
      return Status::Error(config_path + ": eos_token '" + token + "' is not a token of the model's tokenizer.json");
    }
  }
  for (const char* name : {"config.json", "generation_config.json"}) {
    TRAINERD_ASSIGN_OR_RETURN(std::optional<int32_t> id, EosIdFrom((fs::path(model_dir) / name).string()));
    if (id) return *id;
  }
  return Status::Error(model_dir +
                       ": no end-of-sequence token: tokenizer_config.json has no eos_token, and neither "
                       "config.json nor generation_config.json has eos_token_id; the text and completion "
                       "formats end every example with it");
}

StatusOr<TokenDataset> LoadTextDataset(const std::string& path, const std::string& format,
                                       const tokenizer::Tokenizer& tokenizer, int32_t eos_id, int64_t vocab_size,
                                       int64_t max_seq_len, bool train_on_prompt) {
  const bool completion = format == "completion";
  if (!completion && format != "text") {
    return Status::Error(path + ": LoadTextDataset: unknown format '" + format + "'");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot open the data file");
  TokenDataset data;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (IsBlank(line)) continue;
    ++data.lines;
    const std::string where = path + ":" + std::to_string(line_no);
    TRAINERD_ASSIGN_OR_RETURN(json j, ParseObjectLine(line, where));
    TokenExample ex;
    size_t prompt_len = 0;  // leading ids that are not trained
    if (completion) {
      const char* shape = "{\"prompt\": \"...\", \"completion\": \"...\"}";
      TRAINERD_ASSIGN_OR_RETURN(std::string prompt, StringField(j, "prompt", where, "completion", shape));
      TRAINERD_ASSIGN_OR_RETURN(std::string answer, StringField(j, "completion", where, "completion", shape));
      TRAINERD_ASSIGN_OR_RETURN(ex.input_ids, EncodeChecked(tokenizer, prompt + answer, "prompt + completion",
                                                            where, vocab_size));
      if (!train_on_prompt) {
        TRAINERD_ASSIGN_OR_RETURN(std::vector<int64_t> prompt_ids,
                                  EncodeChecked(tokenizer, prompt, "prompt", where, vocab_size));
        prompt_len = std::min(prompt_ids.size(), ex.input_ids.size());
      }
    } else {
      TRAINERD_ASSIGN_OR_RETURN(std::string text, StringField(j, "text", where, "text", "{\"text\": \"...\"}"));
      TRAINERD_ASSIGN_OR_RETURN(ex.input_ids, EncodeChecked(tokenizer, text, "text", where, vocab_size));
    }
    if (ex.input_ids.empty() || ex.input_ids.back() != eos_id) ex.input_ids.push_back(eos_id);
    ex.labels = ex.input_ids;
    // The prompt never covers the final EOS, which is always trained.
    prompt_len = std::min(prompt_len, ex.labels.size() - 1);
    for (size_t i = 0; i < prompt_len; ++i) ex.labels[i] = kIgnoreIndex;
    data.Add(std::move(ex), max_seq_len);
  }
  if (in.bad()) return Status::Error(path + ": read error");
  if (data.lines == 0) return Status::Error(path + ": the data file is empty");
  if (data.examples.empty()) {
    return Status::Error(path + ": all " + std::to_string(data.dropped) + " examples have nothing to train (" +
                         std::to_string(data.truncated) + " of them truncated to data.max_seq_len " +
                         std::to_string(max_seq_len) +
                         (completion ? "; the prompt fills each one, or the example is a single token)"
                                     : "; each is a single token)"));
  }
  return data;
}

DatasetLoader::DatasetLoader(std::string model_dir, std::string format, int64_t vocab_size, int64_t max_seq_len,
                             bool train_on_prompt)
    : model_dir_(std::move(model_dir)),
      format_(std::move(format)),
      vocab_size_(vocab_size),
      max_seq_len_(max_seq_len),
      train_on_prompt_(train_on_prompt) {}

DatasetLoader::~DatasetLoader() = default;

Status DatasetLoader::EnsureTokenizer(const std::string& format, const std::string& path) {
  if (tokenizer_) return Status::Ok();
  const std::string file = (fs::path(model_dir_) / "tokenizer.json").string();
  std::error_code ec;
  if (!fs::exists(file, ec)) {
    return Status::Error("model.path " + model_dir_ + " has no tokenizer.json: data.format " + format +
                         (format_ == "auto" ? " (detected from " + path + ")" : std::string()) +
                         " needs the model's tokenizer (only tokenizer.json tokenizers are supported); add "
                         "it, or give pre-tokenized data in data.format tokens");
  }
  TRAINERD_ASSIGN_OR_RETURN(tokenizer_, tokenizer::Tokenizer::FromFile(file));
  StatusOr<int32_t> eos = FindEosTokenId(model_dir_, *tokenizer_);
  if (!eos.ok()) {
    tokenizer_.reset();
    return eos.status();
  }
  if (*eos < 0 || *eos >= vocab_size_) {
    tokenizer_.reset();
    return Status::Error(model_dir_ + ": the end-of-sequence token id " + std::to_string(*eos) +
                         " is outside the model's vocabulary [0, " + std::to_string(vocab_size_) + ")");
  }
  eos_id_ = *eos;
  return Status::Ok();
}

StatusOr<TokenDataset> DatasetLoader::Load(const std::string& path) {
  std::string format = format_;
  if (format == "auto") {
    TRAINERD_ASSIGN_OR_RETURN(format, DetectDataFormat(path));
  }
  if (format == "tokens") return LoadTokenDataset(path, vocab_size_, max_seq_len_);
  if (format != "text" && format != "completion") {
    return Status::Error(path + ": data.format '" + format + "' is not supported");
  }
  TRAINERD_RETURN_IF_ERROR(EnsureTokenizer(format, path));
  return LoadTextDataset(path, format, *tokenizer_, eos_id_, vocab_size_, max_seq_len_, train_on_prompt_);
}

}  // namespace trainerd::engine
