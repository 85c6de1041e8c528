// gate|up's forward product with SwiGLU in the same GEMM: on a Hopper GPU the
// GEMM of our own (engine/kernels/hopper_gemm.h) writes [gate | up] (kept for
// the backward) and h = silu(gate) * up from its epilogue, which runs under
// the next tile's main loop, so the SwiGLU pass (reading the (N, 2f) product
// back) goes. At the 8b row's shape that costs 0.10 J and 0.19 ms a layer less
// than cuBLAS and the pass (bench/speed/NOTES.md, "The epilogue under the main
// loop"). Everywhere else, and until switched on, the caller's cuBLAS product
// and SwiGLU kernel run as before.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace trainerd::engine {

// x (m, k) w^T for w (2f, k), gate's rows then up's: returns [gate | up]
// (m, 2f) and sets *h to silu(gate) * up (m, f), the left columns of rows
// f + h_spare_columns wide (room for the down group's widened input), where
// the GEMM of our own takes the product; else returns an undefined tensor and
// leaves *h alone. It takes it when the setting (below) is on and: CUDA on a
// Hopper GPU (compute capability 9.0); x and w bf16, 2-D, unit column stride,
// row strides multiples of 8 elements, data 16-byte aligned; 2f a multiple of
// 16, h_spare_columns of 8; k at least 256 and at least one tile of 128 x 256
// for each SM (a smaller product is not worth a launch of its own). Same
// results as torch::mm and the SwiGLU kernel, to the rounding of another
// summation order (gate and up are rounded to bf16 before SwiGLU, as the
// kernel reading them would).
torch::Tensor GateUpWithSwiGlu(const torch::Tensor& x, const torch::Tensor& w, int64_t h_spare_columns,
                               torch::Tensor* h);

// Whether GateUpWithSwiGlu may take products: from the environment's
// TRAINERD_HOPPER_GEMM ("1" on; read once, off when unset) or SetSwiGluGemm.
// Off by default until the training step is measured faster with it.
void SetSwiGluGemm(bool on);

// Products the GEMM of our own has run in this process (tests count them).
int64_t SwiGluGemmRuns();

}  // namespace trainerd::engine
