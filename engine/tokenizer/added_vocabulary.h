// tokenizer.json's "added_tokens": tokens matched in the raw (or normalized)
// text before pre-tokenization, as Hugging Face tokenizers' AddedVocabulary
// does: leftmost-longest matches, single_word, lstrip and rstrip.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/normalizer.h"

namespace trainerd::engine::tokenizer {

struct AddedToken {
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};

// A stretch of text: an added token (id >= 0) or plain text (id == -1).
struct TextSegment {
  size_t start;
  size_t end;
  int32_t id;
};

class AddedVocabulary {
 public:
  // Ids are assigned as HF does on loading: the model's id for a token in its
  // vocabulary, otherwise the next free id after the model's; the file's "id"
  // is not used. `normalizer` (may be null) gives the matched form of
  // normalized tokens.
  static StatusOr<AddedVocabulary> FromJson(const nlohmann::json& added_tokens, const BpeModel& model,
                                            const Normalizer* normalizer);

  // Cuts `text` at the tokens with normalized == `normalized_tokens`.
  // Segments cover `text` in order, except where lstrip/rstrip absorb
  // white space into a token's segment; an empty text gives one empty segment.
  void Segment(std::string_view text, bool normalized_tokens, std::vector<TextSegment>* segments) const;

  std::optional<int32_t> TokenToId(std::string_view content) const;
  // The added token with this id, or null.
  const AddedToken* Find(int32_t id) const;
  // The text a decoder receives for an added token (its normalized form for
  // a normalized token the normalizer changes, else its content).
  const std::string* DecodedForm(int32_t id) const;
  bool empty() const { return by_id_.empty(); }
  int32_t id_end() const { return id_end_; }

 private:
  struct Pattern {
    std::string text;
    int32_t id;
  };
  // Patterns grouped by first byte, longest first, per normalized flag.
  std::vector<Pattern> buckets_[2][256];
  bool has_patterns_[2] = {false, false};
  std::unordered_map<std::string, int32_t> by_content_;
  std::unordered_map<int32_t, AddedToken> by_id_;
  std::unordered_map<int32_t, std::string> decoded_form_;
  int32_t id_end_ = 0;
};

}  // namespace trainerd::engine::tokenizer
