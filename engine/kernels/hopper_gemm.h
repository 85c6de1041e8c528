// A GEMM of our own for Hopper GPUs (sm_90a: TMA and wgmma), for the
// decoder's large bf16 products: D = X W^T with float32 accumulation, W given
// either as stored by a linear layer (n, k) or transposed (k, n), and
// optionally SwiGLU's forward in the epilogue. On an H200 it runs the 8b
// row's forward shapes 1-4% faster than cuBLAS (bench/gemm, docs in
// bench/speed/NOTES.md); elsewhere (another GPU, odd alignment) the caller
// keeps cuBLAS: every launcher says why it did not run.
//
// Torch-free, like fused_kernels.h: raw device pointers, element strides, a
// cudaStream_t passed as `void*`. Built for sm_90a only, in a library of its
// own (trainerd_hopper_gemm; engine/CMakeLists.txt).
//
// The kernel: persistent (one block an SM, tiles of 128 x 256 rasterised in
// groups of 16 row tiles), a producer warpgroup issuing TMA loads of 64-wide
// k-slices into a 4-stage ring (128-byte swizzle), two consumer warpgroups
// on wgmma m64n256k16, and an epilogue that rounds each 64 x 64 chunk to
// bf16 in shared memory (stmatrix) and stores it by TMA. Tails in every
// dimension are TMA's (loads outside read zeros, stores outside are dropped).
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
  int64_t m = 0, n = 0, k = 0;
};

enum class HopperEpilogue {
  kPlain,   // D = X W^T
  // D = X W^T = [gate | up] (n even: W's rows [gate ; up], D's columns
  // [gate | up]) and H = silu(gate) * up, gate and up rounded to bf16 first
  // (as a SwiGLU pass reading D would). W as stored (not transposed).
  kSwiGlu,
};

// Whether the kernel should take an (m x k) (k x n) product on the current
// device, rather than cuBLAS: a Hopper GPU (compute capability 9.0), k at
// least 256, the 128 x 256 tiles filling the waves of one tile an SM to at
// least 80% (the last wave's idle SMs cost what they would have run; the
// kernel splits no product along k, so a short wide product such as a
// 2,093-row chunk of the lm_head's input gradient, 272 tiles on 132 SMs, is
// cuBLAS's), and W as stored: with W transposed it ran 12-13% behind cuBLAS
// at the 8b row's input-gradient shapes (n 4128: a last column of tiles 32
// wide; bench/speed/NOTES.md).
[[nodiscard]] bool HopperGemmSuits(int64_t m, int64_t n, int64_t k, bool w_transposed);

// The kernel's compile-time settings (engine/kernels/hopper_gemm.cu's HG_*),
// for a measurement's log: "stages 4, group 16, ...".
[[nodiscard]] std::string HopperGemmBuild();

// Launches the product on `stream` (asynchronous). Returns "" on success, or
// why it did not launch (device, alignment, shapes) or the launch's CUDA error:
// nothing was written then.
[[nodiscard]] std::string HopperGemm(const HopperGemmOperands& operands, HopperEpilogue epilogue, void* stream);

}  // namespace trainerd::kernels
