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
// alone. How: on CUDA in bf16/fp16 with LibTorch 2.x, packed batches run
// variable-length flash attention over their segments (PackedSegments,
// UsesVarlenAttention), grouped heads without copies, and unpacked batches
// run cuDNN's fused attention by rows where it is available
// (engine/cudnn_attention.h), else the same flash path; elsewhere SDPA, with
// a dense (B, 1, T, T) mask for packed rows (PackedAttentionMask).
//
// Speed (bench/speed): RMSNorm, rotary and SwiGLU run as fused CUDA kernels
// where built (engine/fused_ops.h), the projections that share an input run as
// one autograd node that adds LoRA updates and input gradients in GEMM
// epilogues (engine/linear.h), and the loss never materialises the full
// float32 logits (engine/linear_cross_entropy.h).
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/status.h"
#include "engine/cudnn_attention.h"
#include "engine/linear.h"
#include "engine/linear_group.h"
#include "engine/model_config.h"

namespace trainerd::engine {

struct DecoderLayer {
  torch::Tensor input_norm;           // (H)
  torch::Tensor post_attention_norm;  // (H)
  Linear q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
  // The modules that read one input, as groups (engine/linear_group.h):
  // q|k|v, o, gate|up, down. Widened by LlamaModel::WidenLinearGroups.
  LinearGroup qkv, o, gate_up, down;

  // Each group with its members in the group's order: what ForwardGroup and
  // RefreshLoraCopies take (Widen takes the same members, mutable).
  GroupMembers QkvGroup() const { return {&qkv, {&q_proj, &k_proj, &v_proj}}; }
  GroupMembers OGroup() const { return {&o, {&o_proj}}; }
  GroupMembers GateUpGroup() const { return {&gate_up, {&gate_proj, &up_proj}}; }
  GroupMembers DownGroup() const { return {&down, {&down_proj}}; }

  // The layer's linear modules by their short name (q_proj ... down_proj).
  Linear* Module(const std::string& short_name);
  // All seven, in the checkpoint's order (q_proj ... down_proj): module j of
  // layer i draws LoRA dropout mask kModules * i + j (engine/lora_dropout.h).
  static constexpr int64_t kModules = 7;
  // Each group's first module in that order (the groups' members follow it).
  static constexpr int64_t kQkvFirst = 0, kOFirst = 3, kGateUpFirst = 4, kDownFirst = 6;
  std::array<const Linear*, kModules> Modules() const {
    return {&q_proj, &k_proj, &v_proj, &o_proj, &gate_proj, &up_proj, &down_proj};
  }
};

// The packed examples of a batch as segments of its flattened B*T tokens, for
// variable-length attention: segment i is tokens [cu_seqlens[i], cu_seqlens[i+1]).
// A segment starts at every row start and at every position_id 0, so a row's
// trailing padding (whose positions restart at 0, MakeBatch) is a segment of its own.
struct PackedSegments {
  torch::Tensor cu_seqlens;  // (n_segments + 1) int32 on the batch's device: 0, ..., B*T
  int64_t max_len = 0;       // the longest segment
  bool defined() const { return cu_seqlens.defined(); }
};

// Segments from position_ids (B, T) int64, cu_seqlens placed on `device`.
// Computed on the CPU: position_ids on the GPU are copied to the host first
// (a sync), so a caller that has them on the CPU (MakeBatch) computes the
// segments there and passes them along. capacity > 0: exactly `capacity`
// segments, those past the batch's own empty (cu_seqlens ends in copies of
// B*T), and max_len T: batches of one width then have one shape, whatever
// their examples (a CUDA graph's replay, engine/step_graph.h). A batch with
// more segments than `capacity` is a caller's error (checked).
PackedSegments PackedSegmentsFromPositions(const torch::Tensor& position_ids, const torch::Device& device,
                                           int64_t capacity = 0);

// One segment per row of an unpacked (B, T) batch, built on `device` without
// a host synchronisation.
PackedSegments RowSegments(int64_t b, int64_t t, const torch::Device& device);

// Whether packed attention runs as variable-length flash attention
// (VarlenCausalAttention) rather than with a dense mask. Needs LibTorch 2.x
// (at::_flash_attention_forward), a CUDA device on which flash attention runs
// (checked once per device with a tiny call: builds without flash kernels, or
// GPUs older than Ampere, say no), bf16 or fp16 (flash has no fp32) and a
// head_dim flash's backward takes (a multiple of 8, at most 256). Otherwise the
// dense (B, 1, T, T) mask path is used: CPU, fp32 CUDA, LibTorch 1.13.
bool UsesVarlenAttention(const torch::Device& device, torch::ScalarType dtype, int64_t head_dim);

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
  // at 0 where a packed example starts. segments: position_ids' segments
  // (PackedSegmentsFromPositions), used by the variable-length path; when
  // undefined there, Hidden computes them (one device-to-host copy).
  torch::Tensor Hidden(const torch::Tensor& input_ids, const torch::Tensor& position_ids = {},
                       const PackedSegments& segments = {}) const;
  // (B, T, H) -> (B, T, V) in the model dtype.
  torch::Tensor Logits(const torch::Tensor& hidden) const;
  const torch::Tensor& lm_head() const { return lm_head_; }

  // Whether packed batches (position_ids given) take the variable-length
  // attention path on this model's device and dtype (UsesVarlenAttention).
  bool UsesVarlenAttention() const;

  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }

  // Activation checkpointing: when on (and training with gradients), each of
  // the first `layers` decoder layers (0: all of them) keeps only its input
  // for the backward pass and runs its forward again there
  // (engine/activation_checkpoint.h); the later layers keep their activations.
  void set_gradient_checkpointing(bool on, int64_t layers = 0) {
    gradient_checkpointing_ = on;
    checkpointed_layers_ = layers;
  }
  bool gradient_checkpointing() const { return gradient_checkpointing_; }
  // How many layers recompute when checkpointing is on.
  int64_t checkpointed_layers() const {
    const auto all = static_cast<int64_t>(layers_.size());
    return checkpointed_layers_ > 0 && checkpointed_layers_ < all ? checkpointed_layers_ : all;
  }
  // Whether checkpointing is on and layer `index` is one that recomputes.
  bool Recomputes(size_t index) const {
    return gradient_checkpointing_ && index < static_cast<size_t>(checkpointed_layers());
  }

  // What every layer needs besides its input, prepared once per forward pass:
  // attention's inputs and LoRA dropout's draw.
  struct LayerInputs {
    // Defined: variable-length flash attention over these segments, heads in
    // (N, heads, d) with N = B*T; `positions` (N) int64 are the rotary positions.
    PackedSegments segments;
    torch::Tensor positions;
    // Unpacked batches (one segment per row) where cuDNN's kernel runs
    // (engine/cudnn_attention.h): attention by rows through it instead of flash.
    CudnnAttentionMode cudnn = CudnnAttentionMode::kUnavailable;
    // Rotary tables in the model dtype, (N, 1, d) on the variable-length path
    // (undefined there when the fused rotary kernel applies them) or
    // (B or 1, 1, T, d) on the dense path.
    torch::Tensor cos, sin;
    torch::Tensor mask;  // dense path, packed rows: (B, 1, T, T) bool
    // Training with LoRA dropout: the masks of every layer's modules
    // (engine/lora_dropout.h); undefined otherwise. Activation checkpointing
    // runs a layer again with the same LayerInputs, so with the same masks.
    DropoutDraw dropout;
  };
  LayerInputs PrepareAttention(int64_t b, int64_t t, const torch::Tensor& position_ids,
                                   const PackedSegments& segments) const;
  // The residual stream between decoder layers, (B, T, H): base + delta,
  // left unsummed so that the next norm makes the sum in its own kernel
  // (FusedAddRmsNorm: no pass of its own for the add, either way). delta
  // undefined: base alone (the embeddings).
  struct Residual {
    torch::Tensor base, delta;
  };
  // Decoder layer `index` on h -> the layer's output, h + attention + MLP.
  Residual LayerForward(size_t index, const Residual& h, const LayerInputs& in) const;

  // Moves every layer's frozen projection weights into its groups' widened
  // matrices (engine/linear_group.h), laid out for the LoRA attached now: call
  // once LoRA is attached, for LoRA fine-tuning. The weights keep their names
  // and values (as views).
  void WidenLinearGroups();

  std::vector<DecoderLayer>& layers() { return layers_; }
  const std::vector<DecoderLayer>& layers() const { return layers_; }

  // The base model's tensors under their Hugging Face names, each once (a tied
  // lm_head is not listed separately), in a stable order.
  std::vector<std::pair<std::string, torch::Tensor>> NamedWeights() const;
  // Whether lm_head shares the embedding's tensor (tie_word_embeddings).
  bool tied() const { return config_.tie_word_embeddings; }

  // Every widened group's LoRA copies up to date in one batch (after an
  // optimizer step: engine/linear_group.h, RefreshLoraCopies). Hidden does it
  // first; a replayed CUDA graph of the forward does not (engine/step_graph.h).
  void RefreshLoraCopies() const;

  // Whether a LoRA module has dropout: a training forward then draws its
  // masks (LayerInputs::dropout).
  bool HasDropout() const;

 private:
  explicit LlamaModel(ModelConfig config) : config_(std::move(config)) {}
  // x: the normalised layer input; x_recipe: how it was made (ForwardGroup).
  // layer_masks: the layer's LoRA dropout masks (module 0's number first).
  torch::Tensor Attention(const DecoderLayer& layer, const torch::Tensor& x, const InputRecipe& x_recipe,
                          const LayerInputs& in, const DropoutMasks& layer_masks) const;
  // The spare columns the norm after layer `index - 1` leaves in the gradient
  // of that layer's down output (LinearGroup::gradient_spare_columns); 0 for
  // index 0.
  int64_t DownGradientSpare(size_t index) const {
    return index > 0 ? layers_[index - 1].down.gradient_spare_columns() : 0;
  }

  ModelConfig config_;
  torch::Tensor embed_tokens_;  // (V, H)
  std::vector<DecoderLayer> layers_;
  torch::Tensor norm_;      // (H)
  torch::Tensor lm_head_;   // (V, H); the same tensor as embed_tokens_ when tied
  torch::Tensor inv_freq_;  // (d/2) float32, rope scaling applied
  bool training_ = false;
  bool gradient_checkpointing_ = false;
  int64_t checkpointed_layers_ = 0;  // 0: every layer
};

// RMSNorm as transformers: normalise in float32, cast back, then scale (the
// plain LibTorch formula; the model runs FusedRmsNorm, engine/fused_ops.h).
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

// Causal attention within each segment, as variable-length flash attention
// (at::_flash_attention_forward; autograd differentiates it with
// _flash_attention_backward). q: (N, nh, d); k, v: (N, nkv, d), N = B*T
// flattened tokens; grouped heads are handled by the kernel (no repeat).
// Returns (N, nh, d). Only where UsesVarlenAttention says so.
torch::Tensor VarlenCausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    const PackedSegments& segments);

}  // namespace trainerd::engine
