// SwiGLU forward and backward (contracts in fused_kernels.h): elementwise
// over n elements, grid-strided. When every pointer is 16-byte aligned a
// thread takes whole 16-byte vectors and the n % (16 / sizeof(T)) trailing
// elements go one a thread; otherwise every element is a scalar access.
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

// kN == kVecElems<T>: vectors, then the tail element by element; kN == 1: scalars.
template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    SwiGluForwardKernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out, int64_t n) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t groups = n / kN;
  for (int64_t v = first; v < groups; v += stride) ForwardAt<T, kN>(gate, up, out, v * kN);
  if (kN > 1 && first < n - groups * kN) ForwardAt<T, 1>(gate, up, out, groups * kN + first);
}

template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    SwiGluBackwardKernel(const T* __restrict__ dout, const T* __restrict__ gate, const T* __restrict__ up,
                         T* __restrict__ dgate, T* __restrict__ dup, int64_t n) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t groups = n / kN;
  for (int64_t v = first; v < groups; v += stride) BackwardAt<T, kN>(dout, gate, up, dgate, dup, v * kN);
  if (kN > 1 && first < n - groups * kN) BackwardAt<T, 1>(dout, gate, up, dgate, dup, groups * kN + first);
}

// Blocks for `work` threads' worth of items (at least one block: the tail).
unsigned BlocksFor(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

}  // namespace

std::string SwiGluForward(const void* gate, const void* up, void* out, int64_t n, DType dtype, void* stream) {
  if (n < 0) return "SwiGluForward: bad size n=" + std::to_string(n);
  if (n == 0) return {};
  if (!gate || !up || !out) return "SwiGluForward: a null pointer";
  return DispatchDType(dtype, [&](auto tag) -> std::string {
    using T = decltype(tag);
    constexpr int kN = kVecElems<T>;
    const T* g = static_cast<const T*>(gate);
    const T* u = static_cast<const T*>(up);
    T* o = static_cast<T*>(out);
    const cudaStream_t s = AsStream(stream);
    if (Aligned16(gate) && Aligned16(up) && Aligned16(out)) {
      SwiGluForwardKernel<T, kN><<<BlocksFor(n / kN), kThreads, 0, s>>>(g, u, o, n);
    } else {
      SwiGluForwardKernel<T, 1><<<BlocksFor(n), kThreads, 0, s>>>(g, u, o, n);
    }
    return LaunchError("SwiGluForward");
  });
}

std::string SwiGluBackward(const void* dout, const void* gate, const void* up, void* dgate, void* dup, int64_t n,
                           DType dtype, void* stream) {
  if (n < 0) return "SwiGluBackward: bad size n=" + std::to_string(n);
  if (n == 0) return {};
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
    if (Aligned16(dout) && Aligned16(gate) && Aligned16(up) && Aligned16(dgate) && Aligned16(dup)) {
      SwiGluBackwardKernel<T, kN><<<BlocksFor(n / kN), kThreads, 0, s>>>(d, g, u, dg, du, n);
    } else {
      SwiGluBackwardKernel<T, 1><<<BlocksFor(n), kThreads, 0, s>>>(d, g, u, dg, du, n);
    }
    return LaunchError("SwiGluBackward");
  });
}

}  // namespace trainerd::kernels
