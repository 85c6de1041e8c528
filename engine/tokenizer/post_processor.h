// tokenizer.json's "post_processor": the special tokens put around a single
// encoded sequence (HF's encode with add_special_tokens).
//
// Supported: TemplateProcessing (the "single" template), ByteLevel (changes
// offsets only), Sequence. RobertaProcessing, BertProcessing and others are
// refused with an error naming them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace trainerd::engine::tokenizer {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Rewrites the ids of one sequence; without add_special_tokens nothing is added.
  virtual void Process(std::vector<int32_t>* ids, bool add_special_tokens) const = 0;
};

// A null `config` gives a null post-processor.
StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const nlohmann::json& config);

}  // namespace trainerd::engine::tokenizer
