// A linear layer of the decoder with its optional LoRA update, applied on its
// own (engine/linear_group.h runs the layers that read one input together).
#pragma once

#include <optional>
#include <string>

#include <torch/torch.h>

#include "engine/lora_dropout.h"

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

  // x: (..., in) in the model dtype -> (..., out) in the model dtype. LoRA
  // dropout with mask dropout.Of(0, p) where the adapter has p > 0 and a draw
  // is given (training; engine/lora_dropout.h).
  torch::Tensor Forward(const torch::Tensor& x, const DropoutMasks& dropout = {}) const;
};

}  // namespace trainerd::engine
