// tokenizer.json's "normalizer": rewrites each piece of text that is not an
// added token before pre-tokenization.
//
// Supported: Sequence, Prepend, Replace (String or Regex pattern), Strip, NFC
// (engine/tokenizer/unicode_nfc.h). The other Unicode normalization forms
// (NFD, NFKC, NFKD), Lowercase, BertNormalizer and the rest are refused with
// an error naming them.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace trainerd::engine::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites valid UTF-8 `text` in place; it stays valid UTF-8.
  virtual Status Normalize(std::string* text) const = 0;
};

// A null `config` gives a null normalizer (nothing to do).
StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& config);

}  // namespace trainerd::engine::tokenizer
