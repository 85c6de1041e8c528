#include "engine/text_dataset.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/dataset_cache.h"
#include "engine/jsonl.h"
#include "engine/parallel_map.h"
#include "engine/sha256.h"

namespace trainerd::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Bump when the tokenization of any format changes, so old caches miss.
constexpr const char* kTokenizationVersion = "trainerd-tokenization-1";

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


// A special-token string of tokenizer_config.json ("bos_token", "eos_token"):
// a string or {"content": ...}; nullopt when absent or null.
StatusOr<std::optional<std::string>> ConfigToken(const std::optional<json>& config, const char* key,
                                                 const std::string& path) {
  if (!config || !config->is_object()) return std::optional<std::string>();
  const auto it = config->find(key);
  if (it == config->end() || it->is_null()) return std::optional<std::string>();
  const json* content = &*it;
  if (it->is_object()) {
    const auto c = it->find("content");
    if (c == it->end()) return Status::Error(path + ": " + key + " is an object without \"content\"");
    content = &*c;
  }
  if (!content->is_string()) {
    return Status::Error(path + ": " + key + " must be a string or {\"content\": ...}, got " + it->dump());
  }
  return std::optional<std::string>(content->get<std::string>());
}

std::string FileName(const std::string& path) { return fs::path(path).filename().string(); }

std::string Seconds(std::chrono::steady_clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

}  // namespace

DataOptions DataOptionsFor(const JobSpec& spec, int64_t vocab_size) {
  DataOptions o;
  o.model_dir = spec.model.path;
  o.format = spec.data.format;
  o.chat_template = spec.data.chat_template;
  o.vocab_size = vocab_size;
  o.max_seq_len = spec.data.max_seq_len;
  o.train_on_prompt = spec.data.train_on_prompt;
  if (spec.data.cache) o.cache_dir = spec.data.cache_dir;
  return o;
}

StatusOr<std::string> DetectDataFormat(const std::string& path) {
  JsonlReader reader(path);
  TRAINERD_RETURN_IF_ERROR(reader.Open());
  TRAINERD_ASSIGN_OR_RETURN(std::vector<JsonlLine> first, reader.NextBlock(1));
  if (first.empty()) return Status::Error(path + ": the data file is empty");
  const std::string where = Where(path, first[0].number);
  TRAINERD_ASSIGN_OR_RETURN(json j, ParseObjectLine(first[0].text, where));
  if (j.contains("input_ids")) return std::string("tokens");
  if (j.contains("messages") || j.contains("conversations")) return std::string("chat");
  if (j.contains("text")) return std::string("text");
  if (j.contains("prompt") && j.contains("completion")) return std::string("completion");
  return Status::Error(where + ": cannot tell the data format from the fields (" + KeyList(j) +
                       "): data.format auto knows input_ids (tokens), text (text), prompt + completion "
                       "(completion) and messages or conversations (chat)");
}

StatusOr<int32_t> FindEosTokenId(const std::string& model_dir, const tokenizer::Tokenizer& tokenizer) {
  const std::string config_path = (fs::path(model_dir) / "tokenizer_config.json").string();
  TRAINERD_ASSIGN_OR_RETURN(std::optional<json> config, ReadOptionalJson(config_path));
  TRAINERD_ASSIGN_OR_RETURN(std::optional<std::string> token, ConfigToken(config, "eos_token", config_path));
  if (token) {
    if (std::optional<int32_t> id = tokenizer.TokenToId(*token)) return *id;
    return Status::Error(config_path + ": eos_token '" + *token + "' is not a token of the model's tokenizer.json");
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

StatusOr<std::string> ReadModelChatTemplate(const std::string& model_dir) {
  const std::string jinja = (fs::path(model_dir) / "chat_template.jinja").string();
  std::error_code ec;
  if (fs::exists(jinja, ec)) {
    std::ifstream in(jinja, std::ios::binary);
    if (!in) return Status::Error(jinja + ": cannot open for reading");
    std::ostringstream content;
    content << in.rdbuf();
    return content.str();
  }
  const std::string config_path = (fs::path(model_dir) / "tokenizer_config.json").string();
  TRAINERD_ASSIGN_OR_RETURN(std::optional<json> config, ReadOptionalJson(config_path));
  if (!config || !config->is_object()) return std::string();
  const auto it = config->find("chat_template");
  if (it == config->end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const json& entry : *it) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        return entry["template"].get<std::string>();
      }
    }
    return Status::Error(config_path + ": chat_template is a list without a \"default\" entry");
  }
  return Status::Error(config_path + ": chat_template must be a string or a list, got " + JsonKind(*it));
}

StatusOr<TokenDataset> LoadTextDataset(const std::string& path, const ExampleEncoder& encoder,
                                       int64_t max_seq_len, int threads) {
  struct Encoded {
    Status status;
    TokenExample example;
  };
  JsonlReader reader(path);
  TRAINERD_RETURN_IF_ERROR(reader.Open());
  TokenDataset data;
  for (;;) {
    TRAINERD_ASSIGN_OR_RETURN(std::vector<JsonlLine> block, reader.NextBlock(kJsonlBlockBytes));
    if (block.empty()) break;
    std::vector<Encoded> encoded = ParallelMap<Encoded>(block.size(), threads, [&](size_t i) {
      Encoded e;
      StatusOr<TokenExample> ex = encoder.Encode(block[i].text, Where(path, block[i].number));
      if (ex.ok()) {
        e.example = std::move(ex).value();
      } else {
        e.status = ex.status();
      }
      return e;
    });
    for (Encoded& e : encoded) {
      if (!e.status.ok()) return e.status;
      ++data.lines;
      data.Add(std::move(e.example), max_seq_len);
    }
  }
  if (data.lines == 0) return Status::Error(path + ": the data file is empty");
  if (data.examples.empty()) {
    return Status::Error(path + ": all " + std::to_string(data.dropped) + " examples have nothing to train (" +
                         std::to_string(data.truncated) + " of them truncated to data.max_seq_len " +
                         std::to_string(max_seq_len) +
                         "): completion prompts or chat turns other than the assistant's fill them, or an "
                         "example is a single token; check data.max_seq_len and `trainerd-worker preview`");
  }
  return data;
}

DatasetLoader::DatasetLoader(DataOptions options, NoteFn note)
    : options_(std::move(options)), note_(std::move(note)) {}

DatasetLoader::~DatasetLoader() = default;

void DatasetLoader::Note(const std::string& text) const {
  if (note_) note_(text);
}

Status DatasetLoader::Prepare(const std::string& format, const std::string& path) {
  const std::string detected = options_.format == "auto" ? " (detected from " + path + ")" : std::string();
  if (!tokenizer_) {
    const std::string file = (fs::path(options_.model_dir) / "tokenizer.json").string();
    std::error_code ec;
    if (!fs::exists(file, ec)) {
      return Status::Error("model.path " + options_.model_dir + " has no tokenizer.json: data.format " + format +
                           detected +
                           " needs the model's tokenizer (only tokenizer.json tokenizers are supported); add "
                           "it, or give pre-tokenized data in data.format tokens");
    }
    TRAINERD_ASSIGN_OR_RETURN(tokenizer_, tokenizer::Tokenizer::FromFile(file));
    tokenizer_path_ = file;
  }
  // text and completion examples end with EOS; chat turns end with the template's own tokens.
  if (format != "chat" && eos_id_ < 0) {
    TRAINERD_ASSIGN_OR_RETURN(int32_t eos, FindEosTokenId(options_.model_dir, *tokenizer_));
    if (eos < 0 || eos >= options_.vocab_size) {
      return Status::Error(options_.model_dir + ": the end-of-sequence token id " + std::to_string(eos) +
                           " is outside the model's vocabulary [0, " + std::to_string(options_.vocab_size) + ")");
    }
    eos_id_ = eos;
  }
  if (format != "chat" || chat_template_) return Status::Ok();

  std::string name = options_.chat_template;
  if (name == "auto") {
    TRAINERD_ASSIGN_OR_RETURN(std::string jinja, ReadModelChatTemplate(options_.model_dir));
    if (jinja.empty()) {
      std::string names;
      for (const std::string& n : ChatTemplate::BuiltinNames()) names += (names.empty() ? "" : ", ") + n;
      return Status::Error("data.format chat" + detected + ": the model folder " + options_.model_dir +
                           " has no chat template (no chat_template.jinja, no chat_template in "
                           "tokenizer_config.json); set data.chat_template to one of " + names);
    }
    StatusOr<std::string> recognized = ChatTemplate::Recognize(jinja);
    if (!recognized.ok()) {
      return Status::Error("data.chat_template auto: " + recognized.status().message());
    }
    name = *recognized;
    Note("data: chat template " + name + " (recognised from the model's chat template)");
  }
  StatusOr<ChatTemplate> chat = ChatTemplate::Builtin(name);
  if (!chat.ok()) return Status::Error("data.chat_template: " + chat.status().message());
  const std::string config_path = (fs::path(options_.model_dir) / "tokenizer_config.json").string();
  TRAINERD_ASSIGN_OR_RETURN(std::optional<json> config, ReadOptionalJson(config_path));
  TRAINERD_ASSIGN_OR_RETURN(std::optional<std::string> bos, ConfigToken(config, "bos_token", config_path));
  TRAINERD_ASSIGN_OR_RETURN(std::optional<std::string> eos, ConfigToken(config, "eos_token", config_path));
  bos_token_ = bos.value_or("");
  eos_token_ = eos.value_or("");
  auto require = [&](const std::string& token, const std::string& what) -> Status {
    if (token.empty()) {
      return Status::Error("data.chat_template " + name + " needs the " + what + " of " + config_path +
                           ", which it does not set");
    }
    if (!tokenizer_->TokenToId(token)) {
      return Status::Error("data.chat_template " + name + ": " + what + " '" + token + "' is not a token of " +
                           tokenizer_path_ + "; is this template the model's? (choose another data.chat_template)");
    }
    return Status::Ok();
  };
  if (chat->uses_bos()) TRAINERD_RETURN_IF_ERROR(require(bos_token_, "bos_token"));
  if (chat->uses_eos()) TRAINERD_RETURN_IF_ERROR(require(eos_token_, "eos_token"));
  for (const std::string& token : chat->RequiredTokens()) {
    TRAINERD_RETURN_IF_ERROR(require(token, "the special token"));
  }
  chat_template_ = std::make_unique<ChatTemplate>(std::move(chat).value());
  return Status::Ok();
}

StatusOr<std::string> DatasetLoader::CacheKey(const std::string& format, const std::string& path) {
  Sha256 hash;
  hash.UpdateField(kTokenizationVersion);
  hash.UpdateField(format);
  Sha256 data_hash;
  TRAINERD_RETURN_IF_ERROR(HashFile(path, &data_hash));
  hash.UpdateField(data_hash.HexDigest());
  if (format != "tokens") {
    if (tokenizer_digest_.empty()) {  // once per job: train and eval share the tokenizer
      Sha256 tokenizer_hash;
      TRAINERD_RETURN_IF_ERROR(HashFile(tokenizer_path_, &tokenizer_hash));
      tokenizer_digest_ = tokenizer_hash.HexDigest();
    }
    hash.UpdateField(tokenizer_digest_);
    hash.UpdateField(std::to_string(eos_id_));
    hash.UpdateField(options_.train_on_prompt ? "train_on_prompt" : "mask_prompt");
  }
  if (format == "chat") {
    hash.UpdateField(chat_template_->name());
    hash.UpdateField(bos_token_);
    hash.UpdateField(eos_token_);
  }
  hash.UpdateField(std::to_string(options_.max_seq_len));
  hash.UpdateField(std::to_string(options_.vocab_size));
  return hash.HexDigest();
}

StatusOr<TokenDataset> DatasetLoader::LoadUncached(const std::string& format, const std::string& path) {
  if (format == "tokens") return LoadTokenDataset(path, options_.vocab_size, options_.max_seq_len);
  EncoderSetup setup;
  setup.format = format;
  setup.tokenizer = tokenizer_.get();
  setup.eos_id = eos_id_;
  setup.vocab_size = options_.vocab_size;
  setup.train_on_prompt = options_.train_on_prompt;
  setup.chat_template = chat_template_.get();
  setup.bos_token = bos_token_;
  setup.eos_token = eos_token_;
  const auto start = std::chrono::steady_clock::now();
  const int threads = options_.threads > 0 ? options_.threads : AllCores();
  TRAINERD_ASSIGN_OR_RETURN(TokenDataset data,
                            LoadTextDataset(path, ExampleEncoder(std::move(setup)), options_.max_seq_len, threads));
  Note("data: tokenized " + FileName(path) + " (" + std::to_string(data.lines) + " lines) in " +
       Seconds(std::chrono::steady_clock::now() - start) + " on " + std::to_string(threads) + " threads");
  return data;
}

StatusOr<TokenDataset> DatasetLoader::Load(const std::string& path) {
  std::string format = options_.format;
  if (format == "auto") {
    TRAINERD_ASSIGN_OR_RETURN(format, DetectDataFormat(path));
  }
  if (format != "tokens" && format != "text" && format != "completion" && format != "chat") {
    return Status::Error(path + ": data.format '" + format + "' is not supported");
  }
  if (format != "tokens") TRAINERD_RETURN_IF_ERROR(Prepare(format, path));
  if (options_.cache_dir.empty()) return LoadUncached(format, path);

  TRAINERD_ASSIGN_OR_RETURN(std::string key, CacheKey(format, path));
  const std::string cache_path = (fs::path(options_.cache_dir) / (key + ".tds")).string();
  std::string why_not;
  if (std::optional<TokenDataset> cached = ReadDatasetCache(cache_path, key, &why_not)) {
    Note("data: " + FileName(path) + " from the tokenized cache " + cache_path);
    return std::move(*cached);
  }
  if (why_not != "no cache file") Note("data: the cache file " + cache_path + " is not used (" + why_not + ")");
  TRAINERD_ASSIGN_OR_RETURN(TokenDataset data, LoadUncached(format, path));
  if (Status s = WriteDatasetCache(cache_path, key, data); !s.ok()) {
    Note("data: not cached (" + s.message() + "); the next run tokenizes again");
  }
  return data;
}

}  // namespace trainerd::engine
