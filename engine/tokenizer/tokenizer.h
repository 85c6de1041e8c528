// A text tokenizer read from a Hugging Face tokenizer.json, producing the same
// ids as Hugging Face tokenizers' Tokenizer.encode (and the same text as its
// decode) for the components it supports: a BPE model with the normalizers,
// pre-tokenizers, post-processors and decoders listed in their headers. Any
// other component is an error at load time that names it, never a silent
// difference. Torch-free.
//
// Encoding follows HF's pipeline: added tokens are cut out of the raw text
// (non-normalized ones), each remaining piece is normalized and cut at the
// normalized added tokens, pre-tokenized into words, each word BPE-encoded;
// then the post-processor adds special tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engine/tokenizer/added_vocabulary.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/decoder.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/post_processor.h"
#include "engine/tokenizer/pre_tokenizer.h"

namespace trainerd::engine::tokenizer {

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a model folder that contains one.
  static StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  // `json_text` is the content of a tokenizer.json; `source` names it in errors.
  static StatusOr<std::unique_ptr<Tokenizer>> FromJsonText(std::string_view json_text, const std::string& source);

  // Ids of `text`, special tokens added as the post-processor says when
  // add_special_tokens. Invalid UTF-8 is an error naming the byte offset.
  // Thread-safe.
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens = true) const;

  // Ids of `text` without the post-processor's special tokens (how
  // apply_chat_template tokenizes a rendered conversation), and for each byte
  // offset in `cuts` (ascending, each <= text.size()) in *cut_tokens the index
  // of the token that holds the byte at the offset (Hugging Face's
  // char_to_token), or ids.size() at the end. Inside a run of text between
  // added tokens the tokens' offsets are found by encoding the run cut short
  // (TokenAt). Thread-safe.
  StatusOr<std::vector<int32_t>> EncodeWithCuts(std::string_view text, const std::vector<size_t>& cuts,
                                                std::vector<size_t>* cut_tokens) const;

  // Text of `ids`; ids no token has are skipped, special added tokens too
  // when skip_special_tokens. Thread-safe.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // Added tokens first, then the model's vocabulary.
  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  // One more than the largest id of the model's vocabulary and the added tokens.
  int32_t vocab_size() const;

 private:
  Tokenizer() = default;
  Status EncodePiece(std::string text, bool at_text_start, std::vector<int32_t>* ids) const;
  // Ids of one run of raw text between added tokens: normalized, cut at the
  // normalized added tokens, pre-tokenized and BPE-encoded.
  Status EncodeRun(std::string_view run, bool at_text_start, std::vector<int32_t>* ids) const;
  // For EncodeWithCuts: the index, within the run text[run_start, run_end)
  // whose ids are ids[first_id, end), of the token holding byte `cut`. An
  // offset where the run cut short encodes to a prefix of the run's ids is a
  // token boundary; otherwise the token is the only one between the nearest
  // such boundaries below and above the cut (within 32 characters), or failing
  // those the first id where the run cut at `cut` differs, which no token
  // before it reaches.
  StatusOr<size_t> TokenAt(std::string_view text, size_t run_start, size_t run_end, size_t cut,
                           const std::vector<int32_t>& ids, size_t first_id) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  AddedVocabulary added_;
};

}  // namespace trainerd::engine::tokenizer
