// Loading a job's data files: data.format auto | tokens | text | completion |
// chat → one TokenDataset, tokenized on every core, cached on disk. Torch-free.
//
// text, completion and chat lines become examples through ExampleEncoder
// (engine/example_encoder.h, which states each format's rule) with the model's
// tokenizer.json. Truncation to max_seq_len and dropping of examples with
// nothing to train are TokenDataset::Add's, so every format counts them the
// same way.
//
// The tokenized cache: a file <cache_dir>/<key>.tds (engine/dataset_cache.h)
// whose key is the SHA-256 of everything the result depends on: the data
// file's bytes, tokenizer.json's bytes, the format, the chat template and its
// BOS/EOS strings, the EOS id, train_on_prompt, max_seq_len, the vocabulary
// size and the cache format. A second load of the same data skips
// tokenization; a change to any input is a new key. A damaged cache file is
// re-made; a cache that cannot be written is a note, not an error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/job_spec.h"
#include "common/status.h"
#include "engine/chat_template.h"
#include "engine/example_encoder.h"
#include "engine/token_dataset.h"
#include "engine/tokenizer/tokenizer.h"

namespace trainerd::engine {

struct DataOptions {
  std::string model_dir;               // model.path: tokenizer.json, tokenizer_config.json, chat_template.jinja
  std::string format = "auto";         // data.format
  std::string chat_template = "auto";  // data.chat_template: auto (from the model folder) or a built-in name
  int64_t vocab_size = 0;              // the model's
  int64_t max_seq_len = 2048;
  bool train_on_prompt = false;
  std::string cache_dir;  // empty: no cache
  int threads = 0;        // tokenizing threads; <= 0: all cores
};

// The options of `spec`'s data section for a model with `vocab_size` tokens.
DataOptions DataOptionsFor(const JobSpec& spec, int64_t vocab_size);

// The format of a JSONL data file from the keys of its first non-blank line:
// input_ids → tokens, text → text, prompt + completion → completion, messages
// or conversations → chat; anything else is an error naming file:line.
StatusOr<std::string> DetectDataFormat(const std::string& path);

// The end-of-sequence token of the model folder `model_dir`: tokenizer_config.json's
// "eos_token" (a string or {"content": ...}) looked up in `tokenizer`, else the
// "eos_token_id" of config.json, then of generation_config.json (an integer or
// the first of a list). None of them is an error.
StatusOr<int32_t> FindEosTokenId(const std::string& model_dir, const tokenizer::Tokenizer& tokenizer);

// The Jinja chat template of a model folder: chat_template.jinja (transformers
// 4.43+ saves it there), else tokenizer_config.json's "chat_template" (a
// string, or a list of {name, template} whose "default" is taken); an empty
// string when the folder has none.
StatusOr<std::string> ReadModelChatTemplate(const std::string& model_dir);

// Encodes every line of `path` with `encoder` on `threads` threads (<= 0: all
// cores), in blocks so memory stays bounded. The first bad line (in file order)
// is the error. An empty file, or one whose examples all have nothing to
// train, is an error.
StatusOr<TokenDataset> LoadTextDataset(const std::string& path, const ExampleEncoder& encoder,
                                       int64_t max_seq_len, int threads);

// Loads the data files of one job. The tokenizer, EOS and chat template are
// read once, the first time a text format is met.
class DatasetLoader {
 public:
  // Notes for the user (which template, cache hits, timings) go to `note`.
  using NoteFn = std::function<void(const std::string&)>;
  explicit DatasetLoader(DataOptions options, NoteFn note = nullptr);
  ~DatasetLoader();

  StatusOr<TokenDataset> Load(const std::string& path);

 private:
  Status Prepare(const std::string& format, const std::string& path);
  StatusOr<std::string> CacheKey(const std::string& format, const std::string& path);
  StatusOr<TokenDataset> LoadUncached(const std::string& format, const std::string& path);
  void Note(const std::string& text) const;

  DataOptions options_;
  NoteFn note_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::string tokenizer_path_;
  std::string tokenizer_digest_;  // SHA-256 of tokenizer.json, for the cache key; empty until needed
  int32_t eos_id_ = -1;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::string bos_token_, eos_token_;
};

}  // namespace trainerd::engine
