// Matrix products with one thin side (at most 64 rows or columns): LoRA's
// side products, x A^T, g (sB), t^T g and u^T x, which read a large operand
// once and do little arithmetic on it, so that their speed is the speed of
// that read. Tensor cores (mma.sync, 16-bit inputs, float32 sums); each
// output element is summed in a fixed order (no atomics), the same bits every
// run on one device.
//
// Torch-free like fused_kernels.h: raw device pointers, strides in elements,
// the stream as `void*`, "" on success or a message naming the launcher and
// the problem. Only float16 and bfloat16 (the tensor-core inputs).
//
// Layouts: every large operand has unit column stride and rows `ld` elements
// apart; ld a multiple of 8 and every pointer 16-byte aligned (16-byte
// loads), which is what the checks below refuse otherwise
// (ThinProductLayoutOk says it without launching).
//
// Splits: when the output alone would give the GPU too few blocks, the long
// sum is split into at most kMaxThinSplits ranges whose float32 partial sums
// go to `workspace`, then added in range order by a second kernel. The split
// count depends on the sizes and the device's number of SMs only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/kernels/fused_kernels.h"

namespace trainerd::kernels {

constexpr int64_t kMaxThinRank = 64;
constexpr int kMaxThinSplits = 16;

// y (m, r) = x (m, k) w^T, with w (r, k), r <= kMaxThinRank: the long sum
// runs over k. w's element (i, j) at w + i * w_stride_r + j * w_stride_k,
// one of the two strides 1 (w's rows contiguous: A (rank, in); or its columns:
// sB read in place from a (out, cols) matrix) and the other a multiple of 8.
//   x: rows x_ld apart; y: rows y_ld >= r apart (may be columns of a wider
//   buffer); y may not overlap x or w.
[[nodiscard]] size_t ThinRightProductWorkspaceBytes(int64_t m, int64_t k, int64_t r);
[[nodiscard]] std::string ThinRightProduct(const void* x, int64_t x_ld, const void* w, int64_t w_stride_r,
                                           int64_t w_stride_k, void* y, int64_t y_ld, int64_t m, int64_t k,
                                           int64_t r, float* workspace, size_t workspace_bytes, DType dtype,
                                           void* stream);

// z (r, n) = t^T g with t (m, r), g (m, n), r <= kMaxThinRank: the long sum
// runs over m (the tokens).
//   t: rows t_ld >= r apart; g: rows g_ld >= n apart; z: rows z_ld >= n apart.
[[nodiscard]] size_t ThinLeftProductWorkspaceBytes(int64_t m, int64_t r, int64_t n);
[[nodiscard]] std::string ThinLeftProduct(const void* t, int64_t t_ld, const void* g, int64_t g_ld, void* z,
                                          int64_t z_ld, int64_t m, int64_t r, int64_t n, float* workspace,
                                          size_t workspace_bytes, DType dtype, void* stream);

// Whether a pointer and a row distance (elements of a 16-bit dtype) suit the
// launchers' 16-byte loads.
[[nodiscard]] bool ThinProductLayoutOk(const void* p, int64_t ld);

}  // namespace trainerd::kernels
