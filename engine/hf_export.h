// Writes a Hugging Face model folder (config.json, safetensors weights,
// tokenizer and generation files) that transformers and vLLM load.
#pragma once

#include <string>

#include "common/status.h"
#include "engine/checkpoint.h"
#include "engine/model_config.h"

namespace trainerd::engine {

// Weights above this many bytes are split into shards with an index, as
// transformers' save_pretrained does by default.
inline constexpr int64_t kMaxShardBytes = int64_t{5} << 30;

// Fills `dir` (an existing, empty staging folder) with: config.json (the
// source's, with "dtype"/"torch_dtype" set to `dtype_name`), the weights as
// model.safetensors or model-0000i-of-0000n.safetensors + index, and copies of
// the source folder's tokenizer and generation files.
Status WriteModelFolder(const ModelConfig& config, const NamedTensors& weights, const std::string& dtype_name,
                        const std::string& source_dir, const std::string& dir);

}  // namespace trainerd::engine
