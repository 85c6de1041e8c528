// tokenizer.json's "pre_tokenizer": cuts each normalized piece of text into
// the words the model tokenizes one by one, possibly rewriting them.
//
// Supported: Sequence, ByteLevel, Split, Metaspace, Digits, Punctuation,
// WhitespaceSplit. Others (BertPreTokenizer, Whitespace, UnicodeScripts,
// CharDelimiterSplit, FixedLength) are refused with an error naming them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace trainerd::engine::tokenizer {

struct PreToken {
  std::string text;
  // Whether the piece starts at byte 0 of the text given to Encode
  // (Metaspace's prepend_scheme "first" looks at it).
  bool at_text_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces *pieces by their sub-pieces, in order; empty pieces are dropped.
  virtual Status PreTokenize(std::vector<PreToken>* pieces) const = 0;
};

// A null `config` gives a null pre-tokenizer (each piece is one word).
StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& config);

}  // namespace trainerd::engine::tokenizer
