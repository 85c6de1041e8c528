// Rotary embedding forward and backward (contract in fused_kernels.h).
//
// One block per token (grid-strided beyond 2^31 - 1 tokens): the block first
// computes the token's d/2 (cos, sin) pairs into shared memory, rounded to
// the dtype as transformers' cos/sin tables are, then every head of the token
// reads them, so cosf/sinf run once per (token, frequency) rather than once per
// head. A thread rotates kN pairs (i, i + d/2) of one head: 16-byte vectors
// when both halves, the token stride and the pointers allow, else scalars.
//
// The angles need accurate cosf/sinf: with --use_fast_math nvcc turns them
// into sin.approx/cos.approx, whose error grows with the angle (positions in
// the thousands). nvcc defines no macro for that flag, so engine/CMakeLists.txt
// refuses it, and the fp32 RoPE test at position 8000 would fail with it.

#include <algorithm>
#include <climits>

#include "engine/kernels/dtype_access.cuh"

namespace trainerd::kernels {
namespace {

// The shared device helpers (dtype_access.cuh).
using namespace detail;  // NOLINT(build/namespaces)

constexpr int kThreads = 128;
constexpr int64_t kMaxHeadDim = 8192;  // 2 * d/2 floats of shared memory: 32 KiB

// sin_sign: +1 forward, -1 for the transposed rotation (the backward).
template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    RopeKernel(const T* __restrict__ x, int64_t token_stride, const int64_t* __restrict__ position,
               const float* __restrict__ inv_freq, T* __restrict__ out, int64_t out_token_stride, int64_t tokens,
               int heads, int head_dim, float sin_sign) {
  extern __shared__ float table[];  // cos[0, half), then sin[0, half), dtype-rounded
  const int half = head_dim / 2;
  float* cos_t = table;
  float* sin_t = table + half;
  const int per_head = half / kN;  // thread items per head
  const int items = heads * per_head;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    __syncthreads();  // the previous token's readers are done with the table
    const float p = static_cast<float>(position[t]);  // as position_ids.float()
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      const float f = p * inv_freq[i];
      cos_t[i] = RoundTo<T>(cosf(f));
      sin_t[i] = sin_sign * RoundTo<T>(sinf(f));
    }
    __syncthreads();
    const T* xt = x + t * token_stride;
    T* ot = out + t * out_token_stride;
    for (int item = threadIdx.x; item < items; item += blockDim.x) {
      const int h = item / per_head;
      const int i0 = (item - h * per_head) * kN;
      const int lo = h * head_dim + i0;
      float a[kN], b[kN], ra[kN], rb[kN];
      LoadFloats<T, kN>(xt + lo, a);         // first half: x_i
      LoadFloats<T, kN>(xt + lo + half, b);  // second half: x_{i + d/2}
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        const float c = cos_t[i0 + e], s = sin_t[i0 + e];
        ra[e] = a[e] * c - b[e] * s;  // rotate_half(x)_i = -x_{i + d/2}
        rb[e] = b[e] * c + a[e] * s;  // rotate_half(x)_{i + d/2} = x_i
      }
      StoreFloats<T, kN>(ot + lo, ra);
      StoreFloats<T, kN>(ot + lo + half, rb);
    }
  }
}

}  // namespace

std::string RopeForward(const void* x, int64_t token_stride, const int64_t* position, const float* inv_freq,
                        void* out, int64_t out_token_stride, int64_t tokens, int64_t heads, int64_t head_dim,
                        bool inverse, DType dtype, void* stream) {
  if (tokens < 0 || heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 || head_dim > kMaxHeadDim ||
      heads * head_dim > INT_MAX / 2 || token_stride < heads * head_dim || out_token_stride < heads * head_dim) {
    return "RopeForward: bad sizes tokens=" + std::to_string(tokens) + " heads=" + std::to_string(heads) +
           " head_dim=" + std::to_string(head_dim) + " (even, at most " + std::to_string(kMaxHeadDim) +
           ") token_stride=" + std::to_string(token_stride) + " out_token_stride=" +
           std::to_string(out_token_stride) + " (each at least heads * head_dim)";
  }
  if (tokens == 0) return {};
  if (!x || !position || !inv_freq || !out) return "RopeForward: a null pointer";
  return DispatchDType(dtype, [&](auto tag) -> std::string {
    using T = decltype(tag);
    constexpr int kN = kVecElems<T>;
    const int half = static_cast<int>(head_dim / 2);
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tokens, INT_MAX));
    const size_t shared = 2 * half * sizeof(float);
    const float sign = inverse ? -1.f : 1.f;
    const T* xp = static_cast<const T*>(x);
    T* op = static_cast<T*>(out);
    const int h = static_cast<int>(heads), d = static_cast<int>(head_dim);
    const cudaStream_t s = AsStream(stream);
    // Vectors need every half-row start 16-byte aligned: half, both token
    // strides (elements) and both base pointers.
    if (half % kN == 0 && token_stride % kN == 0 && out_token_stride % kN == 0 && Aligned16(x) && Aligned16(out)) {
      RopeKernel<T, kN><<<grid, kThreads, shared, s>>>(xp, token_stride, position, inv_freq, op, out_token_stride,
                                                       tokens, h, d, sign);
    } else {
      RopeKernel<T, 1><<<grid, kThreads, shared, s>>>(xp, token_stride, position, inv_freq, op, out_token_stride,
                                                      tokens, h, d, sign);
    }
    return LaunchError("RopeForward");
  });
}

}  // namespace trainerd::kernels
