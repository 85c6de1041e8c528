// Rotary embedding forward and backward (contract in fused_kernels.h).
//
// One block per token (grid-strided beyond 2^31 - 1 tokens): the block first
// computes the token's d/2 (cos, sin) pairs into shared memory, rounded to
// the dtype as transformers' cos/sin tables are, then every head of the token,
// in every segment of the launch (q, k and v), reads them, so cosf/sinf run
// once per (token, frequency) rather than once per head. A thread rotates (or
// copies) kN pairs (i, i + d/2) of one head: 16-byte vectors when both halves,
// every token stride and every pointer allow, else scalars.
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

// The segments of one launch, by value in the kernel's parameters: heads
// numbered across them in order (segment 0's, then 1's, ...).
template <typename T>
struct Segments {
  const T* x[kMaxRopeSegments];
  T* out[kMaxRopeSegments];
  int64_t token_stride[kMaxRopeSegments], out_token_stride[kMaxRopeSegments];
  int first_head[kMaxRopeSegments + 1];  // segment s: heads [first_head[s], first_head[s + 1])
  bool rotate[kMaxRopeSegments];
  int count;
};

// kN elements from src to dst unchanged: one 16-byte vector when they fill one.
template <typename T, int kN>
__device__ __forceinline__ void CopyElems(const T* src, T* dst) {
  if constexpr (kN * sizeof(T) == 16) {
    StoreVec(dst, LoadVec(src));
  } else {
#pragma unroll
    for (int e = 0; e < kN; ++e) dst[e] = src[e];
  }
}

// sin_sign: +1 forward, -1 for the transposed rotation (the backward).
template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    RopeKernel(const Segments<T> seg, const int64_t* __restrict__ position, const float* __restrict__ inv_freq,
               int64_t tokens, int head_dim, float sin_sign) {
  extern __shared__ float table[];  // cos[0, half), then sin[0, half), dtype-rounded
  const int half = head_dim / 2;
  float* cos_t = table;
  float* sin_t = table + half;
  const int per_head = half / kN;  // thread items per head
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    __syncthreads();  // the previous token's readers are done with the table
    const float p = static_cast<float>(position[t]);  // as position_ids.float()
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      const float f = p * inv_freq[i];
      cos_t[i] = RoundTo<T>(cosf(f));
      sin_t[i] = sin_sign * RoundTo<T>(sinf(f));
    }
    __syncthreads();
    // The token's items numbered across the segments, thread j taking items
    // j, j + blockDim.x, ...; segment by segment with constant indices (an
    // index known only at run time would copy the parameters to local memory).
#pragma unroll
    for (int s = 0; s < kMaxRopeSegments; ++s) {
      if (s >= seg.count) break;
      const int begin = seg.first_head[s] * per_head, end = seg.first_head[s + 1] * per_head;
      const int threads = blockDim.x;
      const int first = begin + ((static_cast<int>(threadIdx.x) - begin) % threads + threads) % threads;
      const T* xt = seg.x[s] + t * seg.token_stride[s];
      T* ot = seg.out[s] + t * seg.out_token_stride[s];
      const bool rotate = seg.rotate[s];
      for (int item = first; item < end; item += threads) {
        const int h = item / per_head;
        const int i0 = (item - h * per_head) * kN;
        const int lo = (h - seg.first_head[s]) * head_dim + i0;
        if (rotate) {
          float a[kN], b[kN], ra[kN], rb[kN];
          LoadFloats<T, kN>(xt + lo, a);         // first half: x_i
          LoadFloats<T, kN>(xt + lo + half, b);  // second half: x_{i + d/2}
#pragma unroll
          for (int e = 0; e < kN; ++e) {
            const float c = cos_t[i0 + e], sn = sin_t[i0 + e];
            ra[e] = a[e] * c - b[e] * sn;  // rotate_half(x)_i = -x_{i + d/2}
            rb[e] = b[e] * c + a[e] * sn;  // rotate_half(x)_{i + d/2} = x_i
          }
          StoreFloats<T, kN>(ot + lo, ra);
          StoreFloats<T, kN>(ot + lo + half, rb);
        } else {
          CopyElems<T, kN>(xt + lo, ot + lo);
          CopyElems<T, kN>(xt + lo + half, ot + lo + half);
        }
      }
    }
  }
}

}  // namespace

std::string RopeSegments(const RopeSegment* segments, int count, const int64_t* position, const float* inv_freq,
                         int64_t tokens, int64_t head_dim, bool inverse, DType dtype, void* stream) {
  const std::string what = "RopeSegments";
  if (count < 1 || count > kMaxRopeSegments || !segments) {
    return what + ": " + std::to_string(count) + " segments (1 to " + std::to_string(kMaxRopeSegments) + ")";
  }
  if (tokens < 0 || head_dim <= 0 || head_dim % 2 != 0 || head_dim > kMaxHeadDim) {
    return what + ": bad sizes tokens=" + std::to_string(tokens) + " head_dim=" + std::to_string(head_dim) +
           " (even, at most " + std::to_string(kMaxHeadDim) + ")";
  }
  int64_t heads = 0;
  for (int i = 0; i < count; ++i) {
    const RopeSegment& g = segments[i];
    if (g.heads <= 0 || g.token_stride < g.heads * head_dim || g.out_token_stride < g.heads * head_dim) {
      return what + ": segment " + std::to_string(i) + ": bad sizes heads=" + std::to_string(g.heads) +
             " token_stride=" + std::to_string(g.token_stride) + " out_token_stride=" +
             std::to_string(g.out_token_stride) + " (each at least heads * head_dim = " +
             std::to_string(g.heads * head_dim) + ")";
    }
    heads += g.heads;
  }
  if (heads * head_dim > INT_MAX / 2) return what + ": " + std::to_string(heads) + " heads are too many";
  if (tokens == 0) return {};
  if (!position || !inv_freq) return what + ": a null pointer";
  for (int i = 0; i < count; ++i) {
    if (!segments[i].x || !segments[i].out) return what + ": a null pointer in segment " + std::to_string(i);
  }
  return DispatchDType(dtype, [&](auto tag) -> std::string {
    using T = decltype(tag);
    constexpr int kN = kVecElems<T>;
    const int half = static_cast<int>(head_dim / 2);
    Segments<T> seg{};
    seg.count = count;
    // Vectors need every half-row start 16-byte aligned: half, every token
    // stride (elements) and every base pointer.
    bool vectors = half % kN == 0;
    for (int i = 0; i < count; ++i) {
      const RopeSegment& g = segments[i];
      seg.x[i] = static_cast<const T*>(g.x);
      seg.out[i] = static_cast<T*>(g.out);
      seg.token_stride[i] = g.token_stride;
      seg.out_token_stride[i] = g.out_token_stride;
      seg.first_head[i + 1] = seg.first_head[i] + static_cast<int>(g.heads);
      seg.rotate[i] = g.rotate;
      vectors = vectors && g.token_stride % kN == 0 && g.out_token_stride % kN == 0 && Aligned16(g.x) &&
                Aligned16(g.out);
    }
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tokens, INT_MAX));
    const size_t shared = 2 * half * sizeof(float);
    const float sign = inverse ? -1.f : 1.f;
    const int d = static_cast<int>(head_dim);
    const cudaStream_t s = AsStream(stream);
    if (vectors) {
      RopeKernel<T, kN><<<grid, kThreads, shared, s>>>(seg, position, inv_freq, tokens, d, sign);
    } else {
      RopeKernel<T, 1><<<grid, kThreads, shared, s>>>(seg, position, inv_freq, tokens, d, sign);
    }
    return LaunchError(what.c_str());
  });
}

}  // namespace trainerd::kernels
