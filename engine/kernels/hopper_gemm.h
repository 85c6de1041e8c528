// A GEMM of our own for Hopper GPUs (sm_90a: TMA and wgmma), for the 8b
// decoder's large bf16 products: D = X W^T with float32 accumulation, W given
// either as stored by a linear layer (n, k) or transposed (k, n), and
// optionally SwiGLU's forward or backward or the rotary embedding in the
// epilogue. The engine runs it for three products (engine/epilogue_gemm.h):
// gate|up's forward with SwiGLU's forward in the epilogue and down's input
// gradient with SwiGLU's backward in it (TRAINERD_HOPPER_GEMM), and q|k|v's
// forward with q's and k's rotation (TRAINERD_HOPPER_ROPE), where the fusion
// saves a pass's joules; a plain product on it spends the same joules as
// cuBLAS's at the card's power cap, so the others stay cuBLAS's
// (bench/speed/NOTES.md, "The GEMMs at the power cap" and "The epilogue under
// the main loop"). At level 3 (opt-in) down's input gradient also takes
// LoRA's products over its rows (HopperGemmOperands::lora_*), in a kernel of
// its own, measured slower than level 2 so far ("LoRA's products in down's
// backward", "Level 3's epilogue by TMA"). Asked (TRAINERD_HOPPER_DOWN_LORA),
// gate|up's forward also makes down's LoRA product h A^T over the h it
// writes (HopperGemmOperands::lora_a, lora_h_sums), in a kernel of its own.
// bench/gemm/hopper_gemm.cu checks it against cuBLAS and float64 and
// measures it.
//
// Torch-free: raw device pointers, element strides, a cudaStream_t passed as
// `void*`. Built for sm_90a only (a library of its own, engine/CMakeLists.txt).
//
// The kernel: persistent (one block an SM, tiles of 128 x 256 rasterised in
// groups of 16 row tiles), a producer warpgroup issuing TMA loads of 64-wide
// k-slices into a 3-stage ring (128-byte swizzle), two consumer warpgroups
// on wgmma m64n256k16, and an epilogue that rounds each 64 x 64 chunk to
// bf16 in shared memory (stmatrix) and stores it by TMA. Tails in every
// dimension are TMA's (loads outside read zeros, stores outside are dropped).
// The epilogue runs under the next tile's main loop: the consumers hand each
// finished tile to the producer warpgroup's three idle warps through a 64 KB
// buffer (a 3-stage ring makes room), which store it and do SwiGLU's
// arithmetic (forward: h from the buffer; backward: dgate and dup from the
// buffer's dh and gate|up read from memory). SwiGLU's forward then costs
// almost nothing (bench/speed/NOTES.md, "The epilogue under the main loop",
// where the schedules measured against this one are).
#pragma once

#include <cstdint>
#include <string>

namespace trainerd::kernels {

// Every matrix bf16 and row-major, on the current CUDA device; strides in
// elements, multiples of 8 (16 bytes), pointers 16-byte aligned.
struct HopperGemmOperands {
  const void* x = nullptr;  // (m, k), rows x_stride apart
  int64_t x_stride = 0;
  const void* w = nullptr;  // (n, k), or with w_transposed (k, n); rows w_stride apart
  int64_t w_stride = 0;
  bool w_transposed = false;
  void* d = nullptr;  // (m, n), rows d_stride apart; written, never read
  int64_t d_stride = 0;
  void* h = nullptr;  // SwiGLU only: (m, n / 2), rows h_stride apart
  int64_t h_stride = 0;
  const void* gate_up = nullptr;  // SwiGLU's backward only: (m, 2 n), the forward's [gate | up]
  int64_t gate_up_stride = 0;
  // Rotary only: each row's position (m int64) and the 64 frequencies of a
  // 128-wide head (float32); D's first rotate_columns columns are rotated.
  const int64_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int64_t rotate_columns = 0;
  // SwiGLU's backward only, optional: LoRA's products over the rows taken in
  // the epilogue, float32 sums (rows of n floats, contiguous), zeroed and
  // written by the launch:
  //   lora_b_sums (rank_gate + rank_up, n) = [t_gate^T dgate ; t_up^T dup]
  //     for lora_t = [t_gate | t_up] (m, rank_gate + rank_up), gate|up's
  //     x A^T (the B gradients of gate's and up's LoRA, transposed, unscaled);
  //   lora_a_sums (rank_h, n) = lora_u^T h for lora_u (m, rank_h), down's
  //     s g B, and h = silu(gate) * up rounded to bf16 as kSwiGlu writes it
  //     (down's LoRA A gradient).
  // dgate and dup enter rounded to bf16, as D holds them. Either sum may be
  // asked alone (the other's pointer null); ranks 1-256 each (a rank of 0
  // leaves its rows out); thin operands' strides at least their ranks.
  const void* lora_t = nullptr;
  int64_t lora_t_stride = 0;
  int64_t rank_gate = 0, rank_up = 0;
  float* lora_b_sums = nullptr;
  const void* lora_u = nullptr;
  int64_t lora_u_stride = 0;
  int64_t rank_h = 0;
  float* lora_a_sums = nullptr;
  // SwiGLU's forward only, optional: down's LoRA product over the h the
  // epilogue makes, float32 sums zeroed and written by the launch:
  //   lora_h_sums (m, rank_h; rows lora_h_sums_stride floats apart, an even
  //     stride) = h lora_a^T, h rounded to bf16 as written, for lora_a
  //     (rank_h, n / 2; rows lora_a_stride apart, an even stride) down's A's
  //     stacked: down's x A^T, which then needs no pass over h of its own.
  // rank_h 1-256.
  const void* lora_a = nullptr;
  int64_t lora_a_stride = 0;
  float* lora_h_sums = nullptr;
  int64_t lora_h_sums_stride = 0;
  int64_t m = 0, n = 0, k = 0;
};

enum class HopperEpilogue {
  kPlain,   // D = X W^T
  // D = X W^T = [gate | up] (n even: W's rows [gate ; up], D's columns
  // [gate | up]) and H = silu(gate) * up, gate and up rounded to bf16 first
  // (as a SwiGLU pass reading D would). W as stored (not transposed).
  kSwiGlu,
  // SwiGLU's backward through down's input gradient: dh = X W^T (m, n) is
  // rounded to bf16 (as the pass reading it would) and never written; D (m,
  // 2 n) = [dgate | dup] with dgate = dh * up * silu'(gate), dup = dh *
  // silu(gate) from gate_up = [gate | up]. W transposed (k, n) only (down's
  // weight as stored), n a multiple of 8.
  kSwiGluBackward,
  // D = X W^T with the rotary embedding on its first rotate_columns columns
  // (q's and k's heads of a q|k|v product): heads of 128 columns, whose pair
  // (i, i + 64) becomes (a c - b s, b c + a s) for c, s = cos, sin(position
  // of the row * inv_freq[i]) in float32 rounded to bf16, a and b D's
  // elements rounded to bf16 first: the rotary kernel's formula
  // (engine/kernels/rope.cu). rotate_columns a multiple of 128, at most n;
  // W as stored (not transposed).
  kRope,
};

// Whether the current device is a Hopper GPU (compute capability 9.0) and an
// (m x k) (k x n) product is worth a launch of the kernel: k at least 256 and
// at least one of its output tiles for each SM (it splits no product along k,
// so a smaller product leaves SMs idle).
[[nodiscard]] bool HopperGemmSuits(int64_t m, int64_t n, int64_t k);

// Whether the current device is a Hopper GPU (compute capability 9.0).
[[nodiscard]] bool CurrentDeviceIsHopper();

// The kernel's compile-time settings (hopper_gemm.cu's HG_*),
// for a measurement's log: "stages 4, group 16, ...".
[[nodiscard]] std::string HopperGemmBuild();

// Launches the product on `stream` (asynchronous). Returns "" on success, or
// why it did not launch (device, alignment, shapes) or the launch's CUDA error:
// nothing was written then.
[[nodiscard]] std::string HopperGemm(const HopperGemmOperands& operands, HopperEpilogue epilogue, void* stream);

}  // namespace trainerd::kernels
