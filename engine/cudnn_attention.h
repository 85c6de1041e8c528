// Causal attention over whole rows with cuDNN's fused attention kernel, for
// unpacked batches on CUDA (one causal segment per row; a row's trailing
// padding comes after its real tokens, so it never reaches them).
//
// Why: on Hopper, cuDNN's kernel (PyTorch's aten::_scaled_dot_product_cudnn_attention)
// runs a causal forward and backward in about half the time of the flash
// kernel LibTorch bundles (bench/speed/NOTES.md: 1.2 against 2.2 ms a layer
// at 4 x 2048, 32 heads, 8 kv heads, d 128). Packed batches keep variable-
// length flash attention (engine/llama_model.h).
//
// The operator is private to PyTorch and its schema has changed between
// releases, so it is found and called through the dispatcher by name, never
// linked against: a LibTorch without it (1.13, CPU builds) or with another
// schema, or a GPU or head layout the kernel refuses, is found out once per
// (device, dtype, heads, kv heads, head_dim) by a small forward and backward
// compared with flash attention, and then the flash path runs instead.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace trainerd::engine {

// How CudnnCausalAttention passes grouped key/value heads: as they are
// (kNative: the kernel broadcasts them) or repeated to the query heads first
// (kRepeated: a LibTorch whose kernel takes equal head counts only).
enum class CudnnAttentionMode { kUnavailable, kNative, kRepeated };

// Whether, and how, cuDNN attention runs for this device, dtype and head
// layout: a LibTorch with the operator, CUDA, bf16 or fp16 with flash
// attention available there (UsesVarlenAttention: the reference and the
// fallback), and a probe (forward and backward on 2 x 64 tokens with these
// head counts) that matches flash attention within half-precision rounding.
// The first call per key runs the probe; later calls return its verdict.
CudnnAttentionMode CudnnAttentionModeFor(const torch::Device& device, torch::ScalarType dtype, int64_t heads,
                                         int64_t kv_heads, int64_t head_dim);

// Causal attention of each row. q: (B, nh, T, d); k, v: (B, nkv, T, d), any
// strides with the last dimension contiguous (views of (B, T, heads, d)
// projections). Returns (B, nh, T, d). Differentiable (the operator's own
// backward, handed the output gradient in the output's own strides whatever
// layout it arrives in: PyTorch's cache of cuDNN graphs cannot tell gradient
// layouts apart). Only where CudnnAttentionModeFor says kNative or kRepeated.
torch::Tensor CudnnCausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   CudnnAttentionMode mode);

}  // namespace trainerd::engine
