// The architecture of a Hugging Face model folder, read from its config.json.
//
// Defaults follow transformers (LlamaConfig, MistralConfig, Qwen2Config) for
// keys a config.json may leave out; see ParseModelConfig for the exceptions.
// Both layouts of the RoPE settings are accepted:
//   transformers 4.x: "rope_theta": x, "rope_scaling": {"rope_type" | "type": ..., ...} or null;
//   transformers 5:   "rope_parameters": {"rope_type": ..., "rope_theta": x, ...}.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/status.h"

namespace trainerd::engine {

enum class RopeScalingType {
  kNone,    // rope_type "default": plain RoPE
  kLinear,  // positions divided by factor
  kLlama3,  // Llama 3.1 frequency-dependent interpolation
};

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;                           // kLinear, kLlama3
  double low_freq_factor = 1.0;                  // kLlama3 only
  double high_freq_factor = 4.0;                 // kLlama3 only; > low_freq_factor
  int64_t original_max_position_embeddings = 0;  // kLlama3 only; > 0 there
};

struct ModelConfig {
  std::string model_type;  // "llama" | "mistral" | "qwen2"
  // All sizes are > 0. num_attention_heads % num_key_value_heads == 0.
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // q/k/v projections are (num_*_heads * head_dim, hidden_size)
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 0;  // > 0
  double rope_theta = 0;    // RoPE base, > 0
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;  // lm_head shares embed_tokens' weight
  bool qkv_bias = false;  // llama: attention_bias; qwen2: always true; mistral: always false
  bool o_bias = false;    // llama: attention_bias; mistral, qwen2: false
  bool mlp_bias = false;  // llama: mlp_bias; mistral, qwen2: false
  // Sliding-window attention width in tokens (> 0): mistral's sliding_window;
  // qwen2's when use_sliding_window is true. nullopt: full causal attention.
  std::optional<int64_t> sliding_window;
  // Layers with index >= this use sliding_window (when set): 0 for mistral;
  // qwen2's max_window_layers, or where its layer_types switch to
  // "sliding_attention". Meaningless when sliding_window is nullopt.
  int64_t sliding_window_first_layer = 0;
  std::string torch_dtype;  // "dtype" (transformers 5) or "torch_dtype" (4.x); may be empty
  nlohmann::json raw;       // the whole file, to write back on merged export
};

// Reads and parses model_dir/config.json. Errors name the file: missing
// folder or file, invalid JSON (with line, column and byte offset), and
// everything ParseModelConfig rejects.
StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

// Parses an already-loaded config.json object; `origin` names it in errors
// (normally the file's path). Errors name the key and what to do: a missing
// or unsupported model_type (supported: llama, mistral, qwen2), a missing
// required key, a wrong JSON type, a non-positive size, num_attention_heads
// not a multiple of num_key_value_heads, hidden_size not divisible by
// num_attention_heads when head_dim is absent, an unsupported rope type
// (supported: default, linear, llama3) or missing rope parameters.
//
// Required here although transformers has defaults for them: hidden_size,
// intermediate_size, num_hidden_layers, num_attention_heads, vocab_size (a
// silently applied 7B default would only fail later, at weight loading).
// Defaults as transformers applies them when a key is absent:
//   num_key_value_heads  llama: num_attention_heads; mistral: 8; qwen2: 32
//                        (null: num_attention_heads for all three)
//   head_dim             hidden_size / num_attention_heads (also when null)
//   max_position_embeddings  llama 2048, mistral 131072, qwen2 32768
//   rms_norm_eps 1e-6, rope_theta 10000, tie_word_embeddings false,
//   attention_bias false, mlp_bias false,
//   mistral sliding_window 4096 (null: none),
//   qwen2 use_sliding_window false, sliding_window 4096, max_window_layers 28.
StatusOr<ModelConfig> ParseModelConfig(const nlohmann::json& j, const std::string& origin);

}  // namespace trainerd::engine
