// tokenizer.json's "decoder": turns the tokens of a list of ids back into
// text, as Hugging Face tokenizers' decode_chain does.
//
// Supported: ByteLevel, Metaspace, Sequence, Replace (String pattern),
// ByteFallback, Fuse, Strip. WordPiece, BPEDecoder, CTC and others are
// refused with an error naming them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace trainerd::engine::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token strings; the text is their concatenation afterwards.
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

// A null `config` gives a null decoder (tokens are joined with spaces).
StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& config);

}  // namespace trainerd::engine::tokenizer
