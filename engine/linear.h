// A linear layer of the decoder with its optional LoRA update, applied on its
// own (engine/linear_group.h runs the layers that read one input together).
#pragma once

#include <optional>
#include <string>

#include <torch/torch.h>

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

}  // namespace trainerd::engine
