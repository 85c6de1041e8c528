// The Llama-family decoder (llama, mistral, qwen2) as Hugging Face
// transformers computes it, with optional LoRA on its linear layers.
//
// Shapes: B batch, T sequence, H hidden, V vocabulary, nh/nkv query/key-value
// heads, d head_dim. Batches are right-padded and attention is causal, so
// padding (at the end of a row) never influences a real position: no
// attention mask is needed; padded positions carry label -100.
//
// Packed rows (several examples in one sequence) pass position_ids that
// restart at 0 at every example: rotary positions follow them and attention
// stays inside each example (a position attends to earlier positions of the
// same run of positions), so a packed example computes exactly what it would
// alone.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/status.h"
#include "engine/model_config.h"

namespace trainerd::engine {

// A LoRA update of one linear layer: y += scaling * B(A(dropout(x))).
// A and B are float32 whatever the model's dtype (as PEFT keeps them).
struct LoraWeights {
  torch::Tensor a;  // (r, in)
  torch::Tensor b;  // (out, r)
  double scaling = 1.0;
  double dropout = 0.0;
};

struct Linear {
  std::string name;      // HF name without ".weight", e.g. model.layers.0.self_attn.q_proj
  torch::Tensor weight;  // (out, in)
  torch::Tensor bias;    // (out) or undefined
  std::optional<LoraWeights> lora;

  // x: (..., in) in the model dtype -> (..., out) in the model dtype.
  torch::Tensor Forward(const torch::Tensor& x, bool training) const;
};

struct DecoderLayer {
  torch::Tensor input_norm;           // (H)
  torch::Tensor post_attention_norm;  // (H)
  Linear q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;

  // The layer's linear modules by their short name (q_proj ... down_proj).
  Linear* Module(const std::string& short_name);
};

class LlamaModel {
 public:
  // Builds the model from a folder's weights (already in the job's dtype and
  // device). Every tensor the config implies must be present with its shape;
  // errors name the tensor. Unused extra tensors are an error too, since they
  // mean the folder is not the architecture its config.json claims.
  static StatusOr<std::unique_ptr<LlamaModel>> FromWeights(
      const ModelConfig& config, std::map<std::string, torch::Tensor> weights,
      const std::string& origin);

  const ModelConfig& config() const { return config_; }
  torch::ScalarType dtype() const { return embed_tokens_.scalar_type(); }
  torch::Device device() const { return embed_tokens_.device(); }

  // input_ids: (B, T) int64 -> final hidden states (B, T, H) after the last norm.
  // position_ids: undefined (0..T-1 in every row) or (B, T) int64 restarting
  // at 0 where a packed example starts.
  torch::Tensor Hidden(const torch::Tensor& input_ids, const torch::Tensor& position_ids = {}) const;
  // (B, T, H) -> (B, T, V) in the model dtype.
  torch::Tensor Logits(const torch::Tensor& hidden) const;
  const torch::Tensor& lm_head() const { return lm_head_; }

  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }

  std::vector<DecoderLayer>& layers() { return layers_; }
  const std::vector<DecoderLayer>& layers() const { return layers_; }

  // The base model's tensors under their Hugging Face names, each once (a tied
  // lm_head is not listed separately), in a stable order.
  std::vector<std::pair<std::string, torch::Tensor>> NamedWeights() const;
  // Whether lm_head shares the embedding's tensor (tie_word_embeddings).
  bool tied() const { return config_.tie_word_embeddings; }

 private:
  explicit LlamaModel(ModelConfig config) : config_(std::move(config)) {}
  torch::Tensor Attention(const DecoderLayer& layer, const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin, const torch::Tensor& mask) const;

  ModelConfig config_;
  torch::Tensor embed_tokens_;  // (V, H)
  std::vector<DecoderLayer> layers_;
  torch::Tensor norm_;      // (H)
  torch::Tensor lm_head_;   // (V, H); the same tensor as embed_tokens_ when tied
  torch::Tensor inv_freq_;  // (d/2) float32, rope scaling applied
  bool training_ = false;
};

// RMSNorm as transformers: normalise in float32, cast back, then scale.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// Rotary inverse frequencies (d/2,) float32 for the config's rope type.
torch::Tensor RopeInverseFrequencies(const ModelConfig& config);

// Causal grouped-query attention. q: (B, nh, T, d); k, v: (B, nkv, T, d).
// Returns (B, nh, T, d). Uses SDPA where LibTorch has it (2.x), else an
// explicit softmax(QK^T/sqrt(d) + mask)V in float32. `mask`: undefined for
// plain causal attention, or (B, 1, T, T) bool, true where a query may attend
// (PackedAttentionMask).
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& mask = {});
torch::Tensor CausalAttentionExplicit(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& mask = {});

// (B, 1, T, T) bool: causal and within the same packed example, examples
// being the runs of position_ids (B, T) that start at 0.
torch::Tensor PackedAttentionMask(const torch::Tensor& position_ids);

}  // namespace trainerd::engine
