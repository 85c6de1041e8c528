// The decoder's large products, x W^T (a linear layer's forward) and g W (its
// input gradient), on the fastest path the device has: on a Hopper GPU with
// bf16 operands the GEMM of our own (engine/kernels/hopper_gemm.h) where its
// shape rule says it beats cuBLAS (today x W^T only: 1-4% ahead at the 8b
// row's shapes; g W ran behind, bench/speed/NOTES.md), elsewhere torch::mm.
// Same shapes, dtypes and results (to bf16 rounding of a different summation
// order) as torch::mm either way.
//
// The GEMM of our own takes a product when: CUDA, every operand bf16 and 2-D
// with unit column stride, row strides multiples of 8 elements and data 16-byte
// aligned, n a multiple of 8, the shape one it suits (kernels::HopperGemmSuits:
// k at least 256, its tiles filling the SMs' waves to 80%, W as stored); and
// the setting (below) is on.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace trainerd::engine {

// x (m, k) w^T for w (n, k): torch::mm(x, w.t()).
torch::Tensor ProductWithTransposed(const torch::Tensor& x, const torch::Tensor& w);

// x (m, k) w for w (k, n): torch::mm(x, w).
torch::Tensor Product(const torch::Tensor& x, const torch::Tensor& w);

// out (m, n) = x w, out written in place (rows may be a view's): torch::mm_out.
void ProductInto(torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& w);

// x w^T for w (2f, k), gate's rows then up's, with SwiGLU in the same GEMM:
// returns [gate | up] (m, 2f) and sets *h to h = silu(gate) * up (m, f), the
// left columns of rows f + h_spare_columns wide (room for the next group),
// where the GEMM of our own takes it (the setting at level 2, and as for
// ProductWithTransposed); else returns an undefined tensor.
torch::Tensor ProductWithTransposedSwiGlu(const torch::Tensor& x, const torch::Tensor& w, int64_t h_spare_columns,
                                          torch::Tensor* h);

// How much the GEMM of our own may take: 0 nothing, 1 the products above, 2
// those and SwiGLU in gate|up's GEMM. From the environment's
// TRAINERD_HOPPER_GEMM (read once; 0 when unset), or SetHopperGemm. Off by
// default until the training step is measured faster with it.
void SetHopperGemm(int level);

// Products the GEMM of our own has run in this process (tests count them).
int64_t HopperGemmRuns();

}  // namespace trainerd::engine
