// Model FLOPs utilisation (MFU): the FLOPs a training step must do, by a
// stated formula, over the step's time and the GPU's peak dense bf16 rate.
// Torch-free arithmetic, so that it is tested anywhere.
//
// The formula (docs/benchmarks.md, "MFU"): the one the Hugging Face baseline
// script uses, so that figures compare.
//   N_dense  = L * (H*q + 2*H*kv + q*H + 3*H*I) + V*H     (every matmul weight, lm_head included)
//   LoRA / frozen base: 4 * N_dense per token (forward, input gradients; frozen
//                       weights get no weight gradients)
//   full fine-tuning:   6 * N_dense per token (weight gradients too)
//   attention:          4 * L * q * len^2 per sequence of len tokens (causal
//                       scores and values, forward and backward, as counted by
//                       the baseline: 4 * L * seq * d per token)
// with q = heads * head_dim, kv = kv_heads * head_dim. The adapters' own
// FLOPs (under 1% at r = 16) are not counted. Padding is not counted.
#pragma once

#include <cstdint>
#include <string>

#include "engine/model_config.h"

namespace trainerd::engine {

// Weights of every matrix product of a forward pass (N_dense above).
double DenseMatmulParams(const ModelConfig& config);

// FLOPs of one optimizer step over `tokens` non-padding tokens whose
// sequences' squared lengths sum to `sum_squared_lengths`.
double TrainingStepFlops(const ModelConfig& config, bool full_finetune, double tokens, double sum_squared_lengths);

// The GPU's peak dense bf16 tensor-core rate in FLOP/s, from its name as CUDA
// reports it ("NVIDIA H100 80GB HBM3"), by datasheet; 0 when not known (MFU is
// then not reported). Table in flops.cc.
double PeakBf16Flops(const std::string& gpu_name);

}  // namespace trainerd::engine
