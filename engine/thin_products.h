// LoRA's side products, matrix products with one thin side (at most
// kernels::kMaxThinRank = 64 rows of the result, or columns): x A^T, g (sB),
// t^T g, u^T x. On the thin-product kernels (engine/kernels/thin_products.h)
// where they apply, else torch::mm / at::mm_out: the same product with
// float32 sums rounded once, in another summation order.
//
// The kernels apply to CUDA float16 / bfloat16 operands of one dtype, in a
// build with the fused kernels, where
//   - the result is thin in its columns (p x s, s <= 64: the sum over a's
//     columns), a has unit column stride and b one unit stride; or
//   - the result is thin in its rows (p <= 64: the sum over the tokens),
//     a = t^T with t of unit column stride, and b has unit column stride;
// rows a multiple of 8 elements apart and 16-byte aligned data throughout
// (a narrow of the widened matrices' columns qualifies). Anything else, CPU
// tensors included, takes the LibTorch product.
#pragma once

#include <torch/torch.h>

namespace trainerd::engine {

// a (p, q) b (q, s) -> (p, s), a new tensor in a's dtype. Not differentiable:
// for the backward passes and forwards of autograd Functions.
torch::Tensor ThinMm(const torch::Tensor& a, const torch::Tensor& b);

// The same into out (p, s), which may be a view with rows further apart than
// s (columns of a wider buffer); nothing outside out is written.
void ThinMmOut(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b);

// Whether ThinMmOut(out, a, b) runs on the thin-product kernels (for tests
// that must know the kernel, not the fallback, gave a result).
bool ThinMmUsesKernel(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b);

}  // namespace trainerd::engine
