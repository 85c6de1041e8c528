// The decoder's memory-bound steps as fused CUDA kernels with their own
// backward (engine/kernels/fused_kernels.h), and the plain LibTorch formulas
// they replace; and the per-row softmax cross-entropy of the chunked loss
// (not an autograd op: last in this file).
//
// Fused*: on CUDA tensors of float32, float16 or bfloat16, in a build with the
// kernels (FusedKernelsBuilt()), a torch::autograd::Function that launches the
// kernels on the current CUDA stream of the tensor's device and saves only
// what its backward needs. Anywhere else (CPU, other dtypes, a build without
// the kernels: Debian's CPU LibTorch in CI) they return the Plain* formula,
// differentiated by ordinary autograd, so the CPU path is bit-for-bit Plain*.
// Double backward through the kernels is not supported.
//
// Plain*: transformers' computations, in the order and dtype roundings it
// uses; the reference the kernels are tested against.
#pragma once

#include <array>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "engine/kernels/fused_kernels.h"

namespace trainerd::engine {

// RMSNorm as transformers' LlamaRMSNorm: normalise in float32, round to the
// input dtype, then multiply by the weight in that dtype.
// x: (..., H); weight: (H), same dtype as x for the kernel path -> (..., H).
// The kernel path saves x, weight and the per-row 1/rms (float32); it computes
// the weight's gradient only when the weight requires one (full fine-tuning).
// It reads the incoming gradient in place when its rows are evenly spaced
// (a widened group's input gradient, engine/linear_group.h).
// spare_columns: on the kernel path the result is the left part of rows that
// many elements wider (uninitialised), room the consuming LinearGroup fills
// in place of a copy (LinearGroup::spare_columns); ignored elsewhere.
// rstd: when given, set to the per-row 1/rms, (rows) float32 with rows the
// product of x's leading dimensions (not differentiable), so that a consumer
// can make the output again from x (InputRecipe, engine/linear_group.h).
torch::Tensor FusedRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                           int64_t spare_columns = 0, torch::Tensor* rstd = nullptr);
torch::Tensor PlainRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                           torch::Tensor* rstd = nullptr);

// RMSNorm of a residual sum, the add inside the norm's kernels: returns
// {sum, y} with sum = residual + delta (in the dtype, as an add) and
// y = FusedRmsNorm(sum, weight, eps, spare_columns, rstd). The kernel path
// saves sum, weight and rstd; its backward adds the gradient that reaches sum
// (from the next residual add, or the next norm) to the norm's input
// gradient in the same kernel, and hands that one tensor to residual and
// delta. residual, delta: the same shape (..., H) and dtype. delta undefined:
// {residual, FusedRmsNorm(residual, ...)}. Elsewhere (see above): the plain
// add, then FusedRmsNorm, bit-for-bit the unfused computation.
// The incoming gradient of sum may have rows wider than H (read in place).
// gradient_spare_columns: on the kernel path, when y gets a gradient, the
// gradient handed to residual and delta is the left part of rows that many
// elements wider (uninitialised), room the group that made delta fills in
// place of a concatenation (LinearGroup::gradient_spare_columns).
std::pair<torch::Tensor, torch::Tensor> FusedAddRmsNorm(const torch::Tensor& residual, const torch::Tensor& delta,
                                                        const torch::Tensor& weight, double eps,
                                                        int64_t spare_columns = 0, torch::Tensor* rstd = nullptr,
                                                        int64_t gradient_spare_columns = 0);

// silu(gate) * up. gate, up: the same shape (any) and dtype -> that shape.
// The kernel path saves gate and up and recomputes silu in the backward. It
// reads gate, up and the incoming gradient in place when their rows are evenly
// spaced (gate and up the halves of one gate|up product), and then writes
// their gradients as the halves of one buffer too. spare_columns: as for
// FusedRmsNorm (room for the down projection's group). made: the output
// already made where the kernels run (gate|up's GEMM wrote it in its
// epilogue, ForwardGroup's SwiGluOutput): (rows, cols), rows cols +
// spare_columns apart; returned as the node's output without a pass.
torch::Tensor FusedSwiGlu(const torch::Tensor& gate, const torch::Tensor& up, int64_t spare_columns = 0,
                          const torch::Tensor& made = {});
torch::Tensor PlainSwiGlu(const torch::Tensor& gate, const torch::Tensor& up);
// SwiGLU's gradients from the output gradient dout, without autograd:
// {dgate, dup} = {dout * up * silu'(gate), dout * silu(gate)}, each of gate's
// shape and dtype (the halves of one buffer where gate and up are: see
// FusedSwiGlu). The kernel on CUDA, its formula in float32 elsewhere. For a
// node that takes SwiGLU's backward into its own (down's, engine/linear_group.h).
std::pair<torch::Tensor, torch::Tensor> SwiGluGradients(const torch::Tensor& dout, const torch::Tensor& gate,
                                                        const torch::Tensor& up);

// Rotary embedding, rotate_half convention: x * cos + rotate_half(x) * sin,
// with cos/sin = cos/sin(float(position) * inv_freq) in float32, rounded to
// x's dtype, over emb = cat(freqs, freqs).
// x: (tokens, heads, d), d even; for the kernel path without a copy,
//    stride(1) == d and stride(2) == 1 with any token stride (a narrow of a
//    fused q|k|v projection); other layouts are copied first.
// position_ids: (tokens) int64; inv_freq: (d/2) float32; both on x's device.
// Returns (tokens, heads, d), contiguous on the kernel path. The kernel path
// saves position_ids and inv_freq; the backward is the inverse rotation.
torch::Tensor FusedRope(const torch::Tensor& x, const torch::Tensor& position_ids, const torch::Tensor& inv_freq);
torch::Tensor PlainRope(const torch::Tensor& x, const torch::Tensor& position_ids, const torch::Tensor& inv_freq);

// Attention's inputs from the q, k and v projections: {FusedRope(q),
// FusedRope(k), v's own contiguous copy}, the same values. q: (tokens, nh, d);
// k, v: (tokens, nkv, d); any layout FusedRope takes. On the kernel path (as
// FusedRope's, for all three) one launch rotates q and k and copies v, and
// one launch in the backward writes dq, dk and dv side by side into one
// (tokens, (nh + 2 nkv) d) buffer and hands each back as a view of its
// columns: a q|k|v group whose outputs are the columns of one product
// (engine/linear_group.h) takes its output gradient as that buffer, with no
// concatenation. v is copied so that what attention keeps for its backward
// is not a view keeping the whole q|k|v product alive.
std::array<torch::Tensor, 3> FusedQkvRope(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          const torch::Tensor& position_ids, const torch::Tensor& inv_freq);

// The rotary embedding of a q|k|v product in place, outside autograd, for a
// node that returns its product rotated (engine/linear_group.h, QkvRope):
// y (tokens, width) with heads of head_dim across its columns, the first
// rotated_heads of them (q's, then k's) rotated as FusedRope rotates them, the
// rest (v's) untouched. One launch on the kernel path, else PlainRope.
void RotateHeadsInPlace(const torch::Tensor& y, int64_t rotated_heads, int64_t head_dim,
                        const torch::Tensor& position_ids, const torch::Tensor& inv_freq);

// The backward of the rotations: the gradient of a q|k|v product (tokens,
// (sum heads_i) d) from the gradients of its parts (tokens, heads_i, d), any
// strides, in the product's column order (an undefined one: zeros): the
// first rotated_heads heads rotated back, the others copied, side by side in
// one new buffer (one launch on the kernel path). FusedQkvRope's backward
// writes its input gradients this way.
torch::Tensor QkvRopeGradient(const std::vector<torch::Tensor>& grads, const std::vector<int64_t>& heads,
                              int64_t rotated_heads, const torch::Tensor& position_ids,
                              const torch::Tensor& inv_freq);

// dst = src * scale, cast to dst's dtype, for many small 2-D tensors at once:
// torch::mul_out(dst, src, scale) for each, to the bit (the product in
// float32, rounded to src's dtype, then cast to dst's). src and dst: the same sizes, any
// strides (a transposed gradient; a block of a wider matrix, whose other
// elements stay untouched); destinations distinct and not overlapping any
// source. On the kernel path (CUDA tensors of kernel dtypes) the copies go in
// one launch per 48 of one (device, source dtype, destination dtype), instead
// of a generic strided kernel each; elsewhere PlainScaledCasts. With
// `accumulate`, dst.add_(the cast copy) instead, to the bit likewise (what
// autograd's adding a gradient into a parameter's .grad computes).
struct ScaledCast {
  torch::Tensor src, dst;
  double scale = 1.0;
  bool accumulate = false;
};
void FusedScaledCasts(const std::vector<ScaledCast>& casts);
void PlainScaledCasts(const std::vector<ScaledCast>& casts);

// Softmax cross-entropy per row, in place (not an autograd op: the caller, a chunked
// linear + cross-entropy, builds its own gradient from it).
// logits: (rows, V) float32/float16/bfloat16, contiguous; targets: (rows) int64 on the same device.
// Returns loss (rows) float32 as described for the kernel; when write_grad, logits is overwritten
// with softmax - onehot(target) (zero rows where ignored), in logits' dtype.
//   loss[r] = logsumexp(logits[r]) - logits[r][targets[r]], 0 where targets[r] == ignore_index,
// all in float32 from the stored values (engine/kernels/fused_kernels.h).
// The kernel path (CUDA, a kernel dtype, 2-D contiguous logits, V < 2^30, int64 targets on the
// same device) reads the logits once (twice, and writes them once, with write_grad) and bumps their
// version counter when it writes them. A target outside [0, V) that is not ignore_index: loss NaN on the
// kernel path, an index error in Plain (gather). Anything else (CPU, other layouts) is Plain, which
// takes logits of any layout.
// Plain: the LibTorch formula of engine/linear_cross_entropy.cc (float32 logsumexp, gather,
// exp(f - lse), scatter_add of -1, times the valid mask), then copied into logits.
torch::Tensor FusedSoftmaxCrossEntropyRows(torch::Tensor& logits, const torch::Tensor& targets, int64_t ignore_index,
                                           bool write_grad);
torch::Tensor PlainSoftmaxCrossEntropyRows(torch::Tensor& logits, const torch::Tensor& targets, int64_t ignore_index,
                                           bool write_grad);

// LoRA dropout's kernel (kernels::DropoutRows: mask number philox.offset + mask
// of x, scaled, into or onto y) on x (rows, cols) and y of x's shape and dtype
// (y may be x). Returns false, having done nothing, where the kernel does not
// apply: not a CUDA matrix of a kernel dtype with unit column stride, or a
// build without the kernels. Not an autograd op (engine/lora_dropout.h).
bool DropoutRowsOnKernel(const torch::Tensor& x, torch::Tensor& y, const kernels::PhiloxState& philox,
                         uint64_t mask, uint32_t drop_below, float scale, bool accumulate);

// A LoRA module's dropout backward on the kernel (kernels::LoraDropoutBackward:
// dropped = x through mask number philox.offset + mask, scaled; acc += u a
// through the same mask, scaled) for x, dropped and acc (rows, cols), u (rows,
// rank) and a (rank, cols) of one dtype and device. Returns false, having done
// nothing, where the kernel does not apply (not CUDA matrices of a kernel dtype
// with unit column stride in the layouts LoraDropoutBackwardFits takes, or a
// build without the kernels). Not an autograd op (engine/lora_dropout.h).
bool LoraDropoutBackwardOnKernel(const torch::Tensor& x, torch::Tensor& dropped, const torch::Tensor& u,
                                 const torch::Tensor& a, torch::Tensor& acc, const kernels::PhiloxState& philox,
                                 uint64_t mask, uint32_t drop_below, float scale);

// Whether this build has the CUDA kernels (TRAINERD_WITH_CUDA_KERNELS).
bool FusedKernelsBuilt();

}  // namespace trainerd::engine
