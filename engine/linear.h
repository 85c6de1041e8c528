// A linear layer of the decoder with its optional LoRA update, and the
// forward pass of several linear layers that read the same input (q|k|v,
// gate|up) as one autograd node.
//
// Why a node of its own (ForwardShared): autograd would differentiate each
// layer's y = xW^T + s·(xA^T)B^T separately and then add up the input's
// gradients, one (N, in) pass per extra term: for q|k|v with LoRA that is
// five additions plus three LoRA products each written in full. The node
// instead accumulates every term into one gradient buffer in the GEMMs'
// epilogues (addmm_ with beta 1), and runs the group's LoRA A products as one
// GEMM each way. It applies where the frozen weights need no gradient (LoRA
// fine-tuning) and the LoRA dropout is off (or not training); anywhere else
// each layer's plain Forward runs and autograd does the rest. The arithmetic
// is the same products in the model dtype; sums may be ordered differently.
#pragma once

#include <optional>
#include <string>
#include <vector>

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

// Each of `layers` (all with the same `in`) applied to x (..., in): returns
// their outputs (..., out_i) in order, as Forward would.
std::vector<torch::Tensor> ForwardShared(const std::vector<const Linear*>& layers, const torch::Tensor& x,
                                         bool training);

}  // namespace trainerd::engine
