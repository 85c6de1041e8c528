// Passes taken into the epilogues of the GEMM of our own
// (engine/kernels/hopper_gemm.h), on a Hopper GPU: SwiGLU's forward and
// backward in the MLP's GEMMs, and the rotary embedding in q|k|v's.
//
// SwiGLU inside the MLP's GEMMs. Forward: on a Hopper GPU the GEMM of our own
// (engine/kernels/hopper_gemm.h) writes gate|up's product [gate | up] (kept
// for the backward) and h = silu(gate) * up from its epilogue, which runs
// under the next tile's main loop, so the SwiGLU pass (reading the (N, 2f)
// product back) goes: at the 8b row's shape 0.10 J and 0.19 ms a layer less
// than cuBLAS and the pass (bench/speed/NOTES.md, "The epilogue under the main
// loop"). Backward: down's input gradient dh = [g | u] [W ; A] with SwiGLU's
// backward in the epilogue, writing [dgate | dup] from gate|up instead of dh
// (down's node takes SwiGLU's backward into its own, engine/linear_group.h's
// SwiGluInput). Everywhere else, and until switched on, cuBLAS's products
// and the SwiGLU kernel run as before.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace trainerd::engine {

// x (m, k) w^T for w (2f, k), gate's rows then up's: returns [gate | up]
// (m, 2f) and sets *h to silu(gate) * up (m, f), the left columns of rows
// f + h_spare_columns wide (room for the down group's widened input), where
// the GEMM of our own takes the product; else returns an undefined tensor and
// leaves *h alone. It takes it at level 1 or 2 (below) when: x and w bf16 on
// CUDA, 2-D, unit column stride, row strides multiples of 8 elements, data
// 16-byte aligned; 2f a multiple of 16, h_spare_columns of 8; and a shape the
// kernel suits on that device (kernels::HopperGemmSuits: a Hopper GPU, k at
// least 256, a 128 x 256 tile for each SM; a smaller product is not worth a
// launch of its own). Same
// results as torch::mm and the SwiGLU kernel, to the rounding of another
// summation order (gate and up are rounded to bf16 before SwiGLU, as the
// kernel reading them would).
//
// With down_a given (down's LoRA A's stacked, (rank, f) in x's dtype on its
// device, rank 1-256 and at most h_spare_columns, unit column stride, an even
// row stride) and down_t_made, where DownLoraInGateUpEnabled and the GEMM
// takes the product, the epilogue also makes down's t = h down_a^T (float32
// sums, rounded to bf16 once, as the thin product over h would be up to its
// summation order) and writes it into the first `rank` spare columns of h's
// rows, then sets *down_t_made; else leaves it false. Down's node then
// takes those columns as they are (SwiGluInput::lora_t_made) instead of
// reading h again for its product.
torch::Tensor GateUpWithSwiGlu(const torch::Tensor& x, const torch::Tensor& w, int64_t h_spare_columns,
                               torch::Tensor* h, const torch::Tensor& down_a = {}, bool* down_t_made = nullptr);

// The input gradient of down's widened product with SwiGLU's backward in its
// GEMM: for x = [g | u | 0] (N, k) and w = [W ; A ; 0] (k, f), the group's
// widened rows as stored (k at least 256), and gate, up (N, f) the forward's
// halves of one [gate | up] buffer (up's data f elements after gate's, one
// row stride): returns [dgate | dup] (N, 2f), dgate = dh * up * silu'(gate),
// dup = dh * silu(gate) for dh = x w (rounded to bf16 first, as the SwiGLU
// kernel would read it), where the GEMM of our own takes it (level 2,
// bf16 on a Hopper GPU, strides and alignment as for GateUpWithSwiGlu, f a
// multiple of 8, a tile for each SM); else an undefined tensor.
//
// At level 3 the GEMM also takes LoRA's products over the rows that read
// dgate, dup or h (`lora`, optional): gate|up's B gradients and down's A
// gradient, which then need no pass over the (N, 2f) and (N, f) operands of
// their own.
struct SwiGluBackwardLora {
  // In: gate|up's t = x [A_gate ; A_up]^T (N, rank_gate + rank_up), model
  // dtype, undefined for none; down's u = s g B (N, rank_h), undefined for none.
  torch::Tensor gate_up_t;
  int64_t rank_gate = 0, rank_up = 0;
  torch::Tensor down_u;
  // Out, float32, where the GEMM took them (`done`): b_sums (rank_gate +
  // rank_up, f) = [t_gate^T dgate ; t_up^T dup] (unscaled; into the caller's
  // contiguous buffer where one is given, else a new one), a_sums (rank_h,
  // f) = u^T h with h = silu(gate) * up as the forward's GEMM rounds it.
  torch::Tensor b_sums, a_sums;
  bool done = false;
};
torch::Tensor DownInputGradientWithSwiGlu(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& gate,
                                          const torch::Tensor& up, SwiGluBackwardLora* lora = nullptr);

// How far SwiGLU goes into the MLP's GEMMs for a model of this device and
// dtype: 0 not at all; 1 its forward (GateUpWithSwiGlu); 2 its backward too:
// the model makes h outside autograd and hands SwiGLU's backward to down's
// node, and DownInputGradientWithSwiGlu takes products; 3 LoRA's products
// over dgate, dup and h too (SwiGluBackwardLora): gate|up's node hands its t
// to down's, whose backward gives gate|up's B gradients, and down keeps
// gate and up (which it keeps anyway) instead of h. Each GEMM takes its
// products only where it can (above); what it does not take, the nodes do
// as at level 2. From the environment's TRAINERD_HOPPER_GEMM ("0" to "3";
// read once; other values 0) or SetSwiGluGemm, on every device; unset, 2 for
// bf16 on a Hopper GPU and 0 elsewhere (measured faster on the 8b row:
// bench/speed/NOTES.md, "The epilogues in the step"). Level 3 is opt-in: it
// saves the 8b row 6.9 GiB (h kept by no layer) but its epilogue makes down's
// input gradient 1.55 times slower (2.31 against 1.50 ms on an H100, where
// the two thin products it saves take about 0.25; "Level 3's epilogue by
// TMA": the sums' mma.sync wait on the consumers' tensor cores).
void SetSwiGluGemm(int level);
int SwiGluGemmLevel(const torch::Device& device, torch::ScalarType dtype);

// Products the GEMM of our own has run in this process, by kind: launches
// from the host (a CUDA graph's capture counts, its replays do not).
struct EpilogueGemmCounts {
  int64_t forward = 0;    // GateUpWithSwiGlu
  int64_t down_lora = 0;  // of those, with down's t made (GateUpWithSwiGlu's down_a)
  int64_t backward = 0;   // DownInputGradientWithSwiGlu
  int64_t rope = 0;       // ProductWithRope
};
EpilogueGemmCounts EpilogueGemmRuns();

// The rotary embedding in q|k|v's GEMM: x (m, k) w^T for w (n, k) as stored
// (the q|k|v group's rows), with the first rotate_columns columns' heads of
// 128 (q's and k's) rotated by positions (m int64) and inv_freq (64 float32)
// as FusedRope would rotate the product rounded to bf16 (its cos and sin
// rounded to bf16 too); the other columns (v's) the product itself. Where
// the GEMM of our own takes it: the setting on (SetRopeGemm), x and w as
// for GateUpWithSwiGlu, head_dim 128, rotate_columns a multiple of 128 up
// to n, positions and inv_freq contiguous on x's device, and a shape the
// kernel suits; else an undefined tensor.
torch::Tensor ProductWithRope(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& positions,
                              const torch::Tensor& inv_freq, int64_t head_dim, int64_t rotate_columns);

// Whether q|k|v's node applies the rotary embedding itself (engine/
// linear_group.h, QkvRope): in its GEMM's epilogue where ProductWithRope
// takes it, else in place over its product, and attention reads q, k and v
// as views of that product (no rotated copies, no copy of v), for a model of
// this device and dtype. From the environment's TRAINERD_HOPPER_ROPE ("1" on,
// other values off; read once) or SetRopeGemm, on every device; unset, on for
// bf16 on a Hopper GPU and off elsewhere (as SwiGluGemmLevel).
void SetRopeGemm(bool on);
bool RopeGemmEnabled(const torch::Device& device, torch::ScalarType dtype);

// Whether gate|up's GEMM makes down's LoRA product x A^T over h as well
// (GateUpWithSwiGlu's down_a), for a model of this device and dtype: only at
// SwiGLU level 2 or more (down's node then takes h as the GEMM wrote it) and
// without LoRA dropout on down (whose product reads dropped rows). It saves
// the thin product's read of h, (N, f) bf16 a layer, for mma.sync work and
// float32 atomics in the epilogue warps. From the environment's
// TRAINERD_HOPPER_DOWN_LORA ("1" on, other values off; read once) or
// SetDownLoraInGateUp; unset, off: not yet measured in the step.
void SetDownLoraInGateUp(bool on);
bool DownLoraInGateUpEnabled(const torch::Device& device, torch::ScalarType dtype);

// Whether SwiGluGemmLevel's and RopeGemmEnabled's settings are the automatic
// ones (neither in the environment nor set by SetSwiGluGemm / SetRopeGemm).
bool SwiGluGemmLevelIsAutomatic();
bool RopeGemmIsAutomatic();

// Whether TRAINERD_HOPPER_GEMM, TRAINERD_HOPPER_ROPE or TRAINERD_HOPPER_DOWN_LORA is in the environment
// (the worker then says where the epilogues ran, whatever the device).
bool EpilogueGemmSettingsGiven();

}  // namespace trainerd::engine
