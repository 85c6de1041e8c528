// Causal attention of our own for Hopper GPUs (sm_90a: TMA and wgmma), for
// the 8b decoder's heads of 128 with grouped kv heads: the forward, O =
// softmax(scale Q K^T + causal mask) V with the log-sum-exp of each row's
// scaled scores, and the backward, dQ, dK and dV. The measure it has to beat
// is cuDNN's (engine/cudnn_attention.h), which the engine runs where these do
// not apply; engine/hopper_attention.h runs these where they take the
// operands (on by default; TRAINERD_HOPPER_ATTENTION=0 turns them off).
// bench/attention/hopper_attention.cu checks them against float32 reference
// kernels and times them.
//
// Torch-free: raw device pointers, element strides, a cudaStream_t passed as
// `void*`. Built for sm_90a only (the library of hopper_gemm.cu).
//
// The forward (FlashAttention-3's shape, without its intra-warpgroup
// pipelining): a block for each 128 query rows of a head; a producer warp
// loads the rows' Q once and each 128-key tile of K and V by TMA into a
// two-stage ring; two consumer warpgroups of 64 query rows each run S = Q K^T
// on wgmma (both operands in shared memory), the online softmax in registers,
// and O += P V on wgmma with P from registers (rounded to bf16); a key tile
// past the diagonal is never loaded. O is rounded to bf16 in shared memory
// (over the block's Q) and stored by TMA.
#pragma once

#include <cstdint>
#include <string>

namespace trainerd::kernels {

// Every matrix bf16, on the current CUDA device; strides in elements,
// multiples of 8, pointers 16-byte aligned. The layout is the q|k|v group's
// product as the engine hands it to attention: token t of sequence b is row
// b * seq + t of each matrix; query head h is q's columns 128 h .. 128 h +
// 127, kv head g k's and v's columns 128 g ..; query head h reads kv head
// h / (heads / kv_heads).
struct HopperAttentionOperands {
  const void* q = nullptr;  // (batch * seq, >= heads * 128), rows q_stride apart
  const void* k = nullptr;  // (batch * seq, >= kv_heads * 128), rows k_stride apart
  const void* v = nullptr;  // likewise, rows v_stride apart
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
  void* o = nullptr;  // (batch * seq, heads * 128), rows o_stride apart: written
  int64_t o_stride = 0;
  // (batch, heads, seq) float32: log sum_j exp(scale q.k_j) over the row's
  // keys j <= t (natural log): written.
  float* lse = nullptr;
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0;
  float scale = 0.f;  // usually 1 / sqrt(128)
};

// The backward's operands: the forward's (lse as it wrote it) with O, and
// dO in O's layout; dQ, dK and dV are written in q's, k's and v's layouts
// (bf16, strides multiples of 8; they may be column blocks of one buffer).
struct HopperAttentionGradientOperands {
  HopperAttentionOperands forward;  // q, k, v, o, lse as the forward had them
  const void* grad_o = nullptr;     // (batch * seq, heads * 128), rows grad_o_stride apart
  int64_t grad_o_stride = 0;
  void* grad_q = nullptr;  // like q: (batch * seq, heads * 128), rows grad_q_stride apart
  void* grad_k = nullptr;  // like k
  void* grad_v = nullptr;  // like v
  int64_t grad_q_stride = 0, grad_k_stride = 0, grad_v_stride = 0;
  // Scratch of HopperAttentionWorkspaceBytes(batch, seq, heads) bytes,
  // 16-byte aligned: dQ's float32 sums and each row's dO.O.
  void* workspace = nullptr;
  // Optional, both or neither: q and k are the rotary embedding's output
  // (rope.cu's rotate_half formula, element i of a head paired with i + 64),
  // rotated at these positions, and dQ and dK are written rotated back (the
  // rotation's transpose, in float32 before their one rounding to bf16): the
  // gradients with respect to q and k before the rotation. rope_positions:
  // (batch * seq) int64, token t of sequence b at b * seq + t; rope_inv_freq:
  // 64 float32.
  const int64_t* rope_positions = nullptr;
  const float* rope_inv_freq = nullptr;
};

// The backward's scratch: float32 dQ sums for every 64 query rows of a head
// (padded to whole tiles) and a float a row and head.
[[nodiscard]] int64_t HopperAttentionWorkspaceBytes(int64_t batch, int64_t seq, int64_t heads);

// Whether the current device is a Hopper GPU (compute capability 9.0).
[[nodiscard]] bool HopperAttentionSuits();

// Launches the forward on `stream` (asynchronous). Returns "" on success, or
// why it did not launch (device, alignment, shapes) or the launch's CUDA
// error: nothing was written then.
[[nodiscard]] std::string HopperAttentionForward(const HopperAttentionOperands& operands, void* stream);

// Launches the backward on `stream` (asynchronous; three launches: dO.O a
// row with dQ's sums zeroed, the main kernel, dQ's conversion). The main kernel
// takes a block for each pair of 128-key tiles of two kv heads (slots, in
// hopper_attention.cu) and loops over the query heads that share a kv head
// and their query tiles of 64 rows at or past the keys (causal), so the
// grouped heads' dK and dV are summed in registers; dQ's partial products are
// added by atomics onto float32 sums, converted to bf16 by a launch after it.
// "" on success, or why it did not launch.
[[nodiscard]] std::string HopperAttentionBackward(const HopperAttentionGradientOperands& operands, void* stream);

}  // namespace trainerd::kernels
