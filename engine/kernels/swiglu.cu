// SwiGLU forward and backward (contracts in fused_kernels.h): elementwise
// over (rows, cols) matrices with row strides, grid-strided. When every row
// start is 16-byte aligned a thread takes whole 16-byte vectors; otherwise
// every element is a scalar access.
#include <algorithm>

#include "engine/kernels/dtype_access.cuh"

namespace trainerd::kernels {
namespace {

// The shared device helpers (dtype_access.cuh).
using namespace detail;  // NOLINT(build/namespaces)

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 16384;  // grid-stride beyond this: 4M threads in flight is plenty

// 1 / (1 + e^-g): expf is the accurate exponential (no --use_fast_math).
__device__ __forceinline__ float Sigmoid(float g) { return 1.f / (1.f + expf(-g)); }

// kN elements starting at element i.
template <typename T, int kN>
__device__ __forceinline__ void ForwardAt(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                                          int64_t i) {
  float g[kN], u[kN];
  LoadFloats<T, kN>(gate + i, g);
  LoadFloats<T, kN>(up + i, u);
#pragma unroll
  for (int e = 0; e < kN; ++e) g[e] = g[e] * Sigmoid(g[e]) * u[e];
  StoreFloats<T, kN>(out + i, g);
}

template <typename T, int kN>
__device__ __forceinline__ void BackwardAt(const T* __restrict__ dout, const T* __restrict__ gate,
                                           const T* __restrict__ up, T* __restrict__ dgate, T* __restrict__ dup,
                                           int64_t i) {
  float d[kN], g[kN], u[kN];
  LoadFloats<T, kN>(dout + i, d);
  LoadFloats<T, kN>(gate + i, g);
  LoadFloats<T, kN>(up + i, u);
  float dg[kN], du[kN];
#pragma unroll
  for (int e = 0; e < kN; ++e) {
    const float s = Sigmoid(g[e]);
    du[e] = d[e] * g[e] * s;                               // d/du: silu(g)
    dg[e] = d[e] * u[e] * s * (1.f + g[e] * (1.f - s));   // silu'(g) = s (1 + g (1 - s))
  }
  StoreFloats<T, kN>(dgate + i, dg);
  StoreFloats<T, kN>(dup + i, du);
}

// Calls at(r, c) for item v of rows * (cols / kN): kN elements of row r from
// column c, grid-strided. kN == kVecElems<T> when every row start is 16-byte
// aligned and cols % kN == 0, else 1. The 64-bit division per item is cheap
// beside the memory traffic.
template <int kN, typename At>
__device__ __forceinline__ void ForEachItem(int64_t rows, int64_t cols, At at) {
  const int64_t per_row = cols / kN;
  const int64_t items = rows * per_row;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < items; v += step) {
    const int64_t r = v / per_row;
    at(r, (v - r * per_row) * kN);
  }
}

template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    SwiGluForwardKernel(const T* __restrict__ gate, const T* __restrict__ up, int64_t in_stride, T* __restrict__ out,
                        int64_t out_stride, int64_t rows, int64_t cols) {
  ForEachItem<kN>(rows, cols, [&](int64_t r, int64_t c) {
    ForwardAt<T, kN>(gate + r * in_stride, up + r * in_stride, out + r * out_stride, c);
  });
}

template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    SwiGluBackwardKernel(const T* __restrict__ dout, int64_t dout_stride, const T* __restrict__ gate,
                         const T* __restrict__ up, int64_t in_stride, T* __restrict__ dgate, T* __restrict__ dup,
                         int64_t grad_stride, int64_t rows, int64_t cols) {
  ForEachItem<kN>(rows, cols, [&](int64_t r, int64_t c) {
    BackwardAt<T, kN>(dout + r * dout_stride, gate + r * in_stride, up + r * in_stride, dgate + r * grad_stride,
                      dup + r * grad_stride, c);
  });
}

// Blocks for `work` threads' worth of items (at least one block: the tail).
unsigned BlocksFor(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

}  // namespace

std::string SwiGluForward(const void* gate, const void* up, int64_t in_stride, void* out, int64_t out_stride,
                          int64_t rows, int64_t cols, DType dtype, void* stream) {
  if (rows < 0 || cols < 0 || in_stride < cols || out_stride < cols) {
    return "SwiGluForward: bad sizes rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
           " in_stride=" + std::to_string(in_stride) + " out_stride=" + std::to_string(out_stride);
  }
  if (rows == 0 || cols == 0) return {};
  if (!gate || !up || !out) return "SwiGluForward: a null pointer";
  return DispatchDType(dtype, [&](auto tag) -> std::string {
    using T = decltype(tag);
    constexpr int kN = kVecElems<T>;
    const T* g = static_cast<const T*>(gate);
    const T* u = static_cast<const T*>(up);
    T* o = static_cast<T*>(out);
    const cudaStream_t s = AsStream(stream);
    if (Aligned16(gate) && Aligned16(up) && Aligned16(out) && cols % kN == 0 && in_stride % kN == 0 &&
        out_stride % kN == 0) {
      SwiGluForwardKernel<T, kN><<<BlocksFor(rows * (cols / kN)), kThreads, 0, s>>>(g, u, in_stride, o, out_stride,
                                                                                   rows, cols);
    } else {
      SwiGluForwardKernel<T, 1><<<BlocksFor(rows * cols), kThreads, 0, s>>>(g, u, in_stride, o, out_stride, rows, cols);
    }
    return LaunchError("SwiGluForward");
  });
}

std::string SwiGluBackward(const void* dout, int64_t dout_stride, const void* gate, const void* up, int64_t in_stride,
                           void* dgate, void* dup, int64_t grad_stride, int64_t rows, int64_t cols, DType dtype,
                           void* stream) {
  if (rows < 0 || cols < 0 || dout_stride < cols || in_stride < cols || grad_stride < cols) {
    return "SwiGluBackward: bad sizes rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
           " strides dout=" + std::to_string(dout_stride) + " in=" + std::to_string(in_stride) +
           " grad=" + std::to_string(grad_stride);
  }
  if (rows == 0 || cols == 0) return {};
  if (!dout || !gate || !up || !dgate || !dup) return "SwiGluBackward: a null pointer";
  return DispatchDType(dtype, [&](auto tag) -> std::string {
    using T = decltype(tag);
    constexpr int kN = kVecElems<T>;
    const T* d = static_cast<const T*>(dout);
    const T* g = static_cast<const T*>(gate);
    const T* u = static_cast<const T*>(up);
    T* dg = static_cast<T*>(dgate);
    T* du = static_cast<T*>(dup);
    const cudaStream_t s = AsStream(stream);
    if (Aligned16(dout) && Aligned16(gate) && Aligned16(up) && Aligned16(dgate) && Aligned16(dup) && cols % kN == 0 &&
        dout_stride % kN == 0 && in_stride % kN == 0 && grad_stride % kN == 0) {
      SwiGluBackwardKernel<T, kN><<<BlocksFor(rows * (cols / kN)), kThreads, 0, s>>>(d, dout_stride, g, u, in_stride,
                                                                                    dg, du, grad_stride, rows, cols);
    } else {
      SwiGluBackwardKernel<T, 1><<<BlocksFor(rows * cols), kThreads, 0, s>>>(d, dout_stride, g, u, in_stride, dg, du,
                                                                            grad_stride, rows, cols);
    }
    return LaunchError("SwiGluBackward");
  });
}

}  // namespace trainerd::kernels
