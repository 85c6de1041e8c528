// Causal attention on the kernels of our own for Hopper GPUs
// (engine/kernels/hopper_attention.h: forward and backward, the grouped kv
// heads' dK and dV summed inside the backward), for unpacked rows where the
// engine otherwise runs cuDNN's (engine/cudnn_attention.h). On by default
// where the kernels take the operands (bf16 on a Hopper GPU, heads of 128:
// the 8b step measured 0.9% faster than with cuDNN's, bench/speed/NOTES.md);
// TRAINERD_HOPPER_ATTENTION=0 (or SetHopperAttention(false)) turns it off.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace trainerd::engine {

// The setting: TRAINERD_HOPPER_ATTENTION in the environment at first use (0
// off, 1 on; unset: on, the automatic setting), or SetHopperAttention;
// ResetHopperAttention goes back to what the environment said. On, the
// kernels still run only where they take the operands.
void SetHopperAttention(bool on);
void ResetHopperAttention();
bool HopperAttentionEnabled();
// Whether the setting is the automatic one (neither in the environment nor
// set by SetHopperAttention).
bool HopperAttentionIsAutomatic();

// Whether the kernels take operands of this device, dtype and head size:
// the setting on, a build with the Hopper kernels, a Hopper GPU, bf16, heads
// of 128. What a caller decides by before the operands exist.
bool HopperAttentionFits(const torch::Device& device, torch::ScalarType dtype, int64_t head_dim);

// Whether the kernels take these operands: HopperAttentionFits, and q, k and
// v laid out as below.
bool HopperAttentionTakes(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          int64_t head_dim);

// Causal attention of `batch` rows of `seq` tokens. q (batch * seq, heads *
// 128), k and v (batch * seq, kv_heads * 128): bf16 matrices with unit column
// stride and row strides multiples of 8 (column views of the q|k|v group's
// product are what the engine passes). Returns O (batch * seq, heads * 128),
// contiguous. Differentiable: the backward writes dq, dk and dv into one
// (batch * seq, (heads + 2 kv_heads) * 128) buffer and returns column views of
// it. Only where HopperAttentionTakes.
// Given rope_positions ((batch * seq) int64) and rope_inv_freq (64 float32),
// on q's device: q and k are the rotary embedding's output at those
// positions, and the backward returns q's and k's gradients rotated back, in
// its own passes (dQ's conversion, dK's epilogue): the gradients with respect
// to q and k before the rotation, for a producer that rotated them itself and
// takes them so (QkvRope::gradient_rotated_back, engine/linear_group.h).
torch::Tensor HopperCausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                    const torch::Tensor& rope_positions = {}, const torch::Tensor& rope_inv_freq = {});

// How many forwards ran on the kernel since the process started (what a
// test or the worker's note can read).
int64_t HopperAttentionRuns();

}  // namespace trainerd::engine
