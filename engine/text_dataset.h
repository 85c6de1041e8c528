// The `text` and `completion` data formats, and the choice between them and
// `tokens` (data.format: auto | tokens | text | completion). Torch-free.
//
//   text:       {"text": s}                   ids = Encode(s) + EOS, every token trained
//   completion: {"prompt": p, "completion": c}
//               ids = Encode(p + c) + EOS; the first len(Encode(p)) ids are the
//               prompt (label -100) unless train_on_prompt; EOS is always trained
//
// Encode is the model's tokenizer.json with the post-processor's special tokens
// (Hugging Face's encode default), as TRL's SFTTrainer and axolotl tokenize.
// The prompt/completion boundary is the number of ids of Encode(p) on its own,
// special tokens included (TRL's rule), even where a token of Encode(p + c)
// spans the boundary. EOS is not appended when the ids already end with it.
// Other fields on a line are ignored. Truncation to max_seq_len and dropping of
// examples with nothing to train are those of LoadTokenDataset, and the result
// is the same TokenDataset.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "engine/token_dataset.h"
#include "engine/tokenizer/tokenizer.h"

namespace trainerd::engine {

// The format of a JSONL data file from the keys of its first non-blank line:
// input_ids → "tokens", text → "text", prompt + completion → "completion";
// messages or conversations (chat) and anything else are errors naming file:line.
StatusOr<std::string> DetectDataFormat(const std::string& path);

// The end-of-sequence token of the model folder `model_dir`: tokenizer_config.json's
// "eos_token" (a string or {"content": ...}) looked up in `tokenizer`, else the
// "eos_token_id" of config.json, then of generation_config.json (an integer or
// the first of a list). None of them is an error.
StatusOr<int32_t> FindEosTokenId(const std::string& model_dir, const tokenizer::Tokenizer& tokenizer);

// Reads a `text` or `completion` (`format`) file with `tokenizer`, appending
// `eos_id`. Every id must be below vocab_size (the model's). Errors name
// file:line: malformed JSON, invalid UTF-8, a missing field, a field that is not
// a string. An empty file, or one whose examples all have nothing to train, is an error.
StatusOr<TokenDataset> LoadTextDataset(const std::string& path, const std::string& format,
                                       const tokenizer::Tokenizer& tokenizer, int32_t eos_id, int64_t vocab_size,
                                       int64_t max_seq_len, bool train_on_prompt);

// Loads the data files of one job: `format` is data.format (auto | tokens | text
// | completion). The tokenizer (model_dir/tokenizer.json) and EOS are read once,
// the first time a text format is met.
class DatasetLoader {
 public:
  DatasetLoader(std::string model_dir, std::string format, int64_t vocab_size, int64_t max_seq_len,
                bool train_on_prompt);
  ~DatasetLoader();

  StatusOr<TokenDataset> Load(const std::string& path);

 private:
  Status EnsureTokenizer(const std::string& format, const std::string& path);

  std::string model_dir_, format_;
  int64_t vocab_size_, max_seq_len_;
  bool train_on_prompt_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  int32_t eos_id_ = -1;
};

}  // namespace trainerd::engine
