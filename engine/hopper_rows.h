// The rule for a matrix the Hopper kernels of our own read or write by TMA
// (engine/kernels/hopper_gemm.h, engine/kernels/hopper_attention.h), shared
// by the engine's callers of both (engine/epilogue_gemm, engine/hopper_attention).
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace trainerd::engine {

// A bf16 matrix on CUDA with unit column stride, rows a multiple of 8
// elements (16 bytes) apart and at least a row wide, 16-byte aligned.
inline bool HopperBf16Rows(const torch::Tensor& t) {
  return t.is_cuda() && t.scalar_type() == torch::kBFloat16 && t.dim() == 2 && t.stride(1) == 1 &&
         t.stride(0) % 8 == 0 && t.stride(0) >= t.size(1) && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

}  // namespace trainerd::engine
