// LoRA dropout over (rows, cols) matrices with masks made from Philox
// (contract in fused_kernels.h, the keep rule in philox.h).
//
// Rows whose columns, strides and pointers allow it take the vector kernel: a
// block row per matrix row (blockIdx.y, no index division), each thread 16
// bytes (8 elements of a 16-bit dtype, 4 of float32), in one load and one
// store, decided by one Philox call (eight elements a call, philox.h). Any
// other layout takes the scalar kernel: a thread per group of eight
// consecutive elements of the row-major order (a group may span rows). The seed and
// offset are read from device memory when the launch was recorded in a CUDA
// graph, so that each replay draws the generator's numbers of that replay.

#include <algorithm>

#include "engine/kernels/dtype_access.cuh"
#include "engine/kernels/philox.h"

namespace trainerd::kernels {
namespace {

using namespace detail;  // NOLINT(build/namespaces)

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 132 * 16;

__device__ __forceinline__ uint64_t MaskNumber(const PhiloxState& philox, uint64_t mask_index) {
  const uint64_t offset =
      philox.offset_ptr ? static_cast<uint64_t>(*philox.offset_ptr) + philox.offset_intragraph : philox.offset;
  return offset + mask_index;
}

__device__ __forceinline__ uint64_t Seed(const PhiloxState& philox) {
  return philox.seed_ptr ? static_cast<uint64_t>(*philox.seed_ptr) : philox.seed;
}

// What an element of y becomes, as float32: x dropped (T(x * scale) where
// kept, 0 where not) or, with accumulate, T(y + that) where kept and y where not.
template <typename T>
__device__ __forceinline__ float Apply(float x, float y, bool keep, float scale, bool accumulate) {
  const float d = keep ? RoundTo<T>(__fmul_rn(x, scale)) : 0.f;
  return accumulate ? (keep ? ToFloat<T>(FromFloat<T>(y + d)) : y) : d;
}

// cols a multiple of kVecElems<T>, strides too, pointers 16-byte aligned.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    DropoutVectorKernel(const T* x, int64_t x_stride, T* y, int64_t y_stride, int64_t rows, int vectors_per_row,
                        PhiloxState philox, uint64_t mask_index, uint32_t drop_below, float scale, bool accumulate) {
  constexpr int kN = kVecElems<T>;  // 8 or 4: within one group of eight, since cols % kN == 0
  const uint64_t seed = Seed(philox), mask = MaskNumber(philox, mask_index);
  const int64_t cols = int64_t{vectors_per_row} * kN;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int v = blockIdx.x * kThreads + threadIdx.x; v < vectors_per_row; v += gridDim.x * kThreads) {
      float in[kN], out[kN];
      LoadFloats<T, kN>(x + r * x_stride + int64_t{v} * kN, in);
      T* out_p = y + r * y_stride + int64_t{v} * kN;
      if (accumulate) LoadFloats<T, kN>(out_p, out);
      const uint64_t e0 = static_cast<uint64_t>(r * cols + int64_t{v} * kN);
      const Philox4 words = DropoutWords(seed, mask, e0 >> 3);
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        const bool keep = DropoutKeeps(DropoutDraw16(words, static_cast<int>(e0 & 7) + i), drop_below);
        out[i] = Apply<T>(in[i], accumulate ? out[i] : 0.f, keep, scale, accumulate);
      }
      StoreFloats<T, kN>(out_p, out);
    }
  }
}

// Any layout: a thread per group of eight elements of the row-major order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    DropoutScalarKernel(const T* x, int64_t x_stride, T* y, int64_t y_stride, int64_t rows, int64_t cols,
                        PhiloxState philox, uint64_t mask_index, uint32_t drop_below, float scale, bool accumulate) {
  const uint64_t seed = Seed(philox), mask = MaskNumber(philox, mask_index);
  const int64_t total = rows * cols;
  const int64_t groups = (total + 7) / 8;
  for (int64_t q = blockIdx.x * int64_t{kThreads} + threadIdx.x; q < groups; q += int64_t{gridDim.x} * kThreads) {
    const Philox4 words = DropoutWords(seed, mask, static_cast<uint64_t>(q));
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t e = 8 * q + j;
      if (e >= total) break;
      const int64_t r = e / cols, c = e - r * cols;
      T& out = y[r * y_stride + c];
      const float value = Apply<T>(ToFloat<T>(x[r * x_stride + c]), accumulate ? ToFloat<T>(out) : 0.f,
                                   DropoutKeeps(DropoutDraw16(words, j), drop_below), scale, accumulate);
      out = FromFloat<T>(value);
    }
  }
}

}  // namespace

std::string DropoutRows(const void* x, int64_t x_stride, void* y, int64_t y_stride, int64_t rows, int64_t cols,
                        const PhiloxState& philox, uint64_t mask_index, uint32_t drop_below, float scale,
                        bool accumulate, DType dtype, void* stream) {
  if (rows < 0 || cols < 0) return "DropoutRows: negative sizes";
  if (rows == 0 || cols == 0) return {};
  if (!x || !y) return "DropoutRows: null pointer";
  if (x_stride < cols || y_stride < cols) return "DropoutRows: row stride below the columns";
  const cudaStream_t s = AsStream(stream);
  return DispatchDType(dtype, [&](auto tag) -> std::string {
    using T = decltype(tag);
    constexpr int kN = kVecElems<T>;
    const T* xt = static_cast<const T*>(x);
    T* yt = static_cast<T*>(y);
    if (cols % kN == 0 && x_stride % kN == 0 && y_stride % kN == 0 && cols / kN <= INT32_MAX && Aligned16(x) &&
        Aligned16(y)) {
      const int vectors = static_cast<int>(cols / kN);
      const dim3 grid(static_cast<unsigned>(std::min<int64_t>((vectors + kThreads - 1) / kThreads, 64)),
                      static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
      DropoutVectorKernel<T><<<grid, kThreads, 0, s>>>(xt, x_stride, yt, y_stride, rows, vectors, philox, mask_index,
                                                       drop_below, scale, accumulate);
    } else {
      const int64_t groups = (rows * cols + 7) / 8;
      const dim3 grid(static_cast<unsigned>(std::min<int64_t>((groups + kThreads - 1) / kThreads, kMaxBlocks)));
      DropoutScalarKernel<T><<<grid, kThreads, 0, s>>>(xt, x_stride, yt, y_stride, rows, cols, philox, mask_index,
                                                       drop_below, scale, accumulate);
    }
    return LaunchError("DropoutRows");
  });
}

}  // namespace trainerd::kernels
