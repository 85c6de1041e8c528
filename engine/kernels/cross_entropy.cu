// Softmax cross-entropy over rows of logits, written in place (contract in
// fused_kernels.h).
//
// Layout: one block per row (grid-strided beyond 2^31 - 1 rows). Pass 1 reads
// the row once: each thread folds its elements into an online-softmax pair
// (m: the largest value seen, s: sum of exp(x - m)), rescaling s when m
// grows; the block's pairs are then merged in a fixed order (warp shuffles,
// one shared-memory step, lane 0's result broadcast), so every thread uses
// the same lse = m + log(s) and the results are the same bits every run.
// Pass 2 (write_grad) reads the row again and overwrites it with
// exp(x - lse) - [j == target]. Traffic: two reads and one write of the
// logits. A row (256 KiB of bf16 at vocab 128256) cannot stay on chip
// between the passes; the second read hits L2 where the row is still there.
//
// Loads: the kernel writes the row it reads, so not the read-only __ldg of
// dtype_access.cuh's LoadVec (ld.global.nc requires memory that no thread
// writes during the kernel). Pass 1 loads with .cg (cache in L2 only: a row
// outgrows L1, and pass 2 wants it in L2), pass 2 with .cs (evict first: the
// row's last read, which leaves L2 to the rows other blocks will re-read).
// The target logit is read by thread 0 in pass 1, before the block reduction's
// barrier, hence before any thread of the block overwrites the row.
//
// Vector path: 16-byte vectors when the logits pointer is 16-byte aligned and
// a row is a whole number of vectors (then every row start is aligned); any
// other layout takes the scalar path: the same math, a different summation
// order. Each thread keeps kUnroll loads in flight before folding them.
//
// expf/logf are the accurate ones (no --use_fast_math; see engine/CMakeLists.txt).
#include <algorithm>
#include <climits>
#include <type_traits>

#include "engine/kernels/dtype_access.cuh"

namespace trainerd::kernels {
namespace {

// The shared device helpers (dtype_access.cuh).
using namespace detail;  // NOLINT(build/namespaces)

// 512 threads a block. ptxas (sm_90) gives the vector path 56 registers a
// thread (60 for float32), no spills, the scalar path 32: two vector blocks
// (rows) an SM, 1024 of its 2048 threads, with 2 x 512 x kUnroll x 16 B =
// 64 KiB of loads in flight, enough to cover DRAM latency; while one block
// waits at the barrier between its passes (until its slowest warp is done:
// the larger the block, the longer), the other keeps loading. 1024 threads
// would fit one block an SM and idle it at every barrier; fewer threads mean
// more rows in flight, each holding L2 until its pass 2 (at 2 x 132 rows of
// 256 KiB, H100/H200's 50 MiB L2 already keeps only part of them). At vocab
// 128256 (bf16: 16032 vectors) a thread takes about 31 vectors, in 8 rounds.
constexpr int kThreads = 512;
// 16-byte loads a thread issues before it folds them: 4 gives the 56-60
// registers and the 64 KiB an SM above. Untimed alternatives: 2 (40-44
// registers, still 2 blocks an SM for 16-bit types: half the bytes in flight)
// or 1 (32 registers: 4 blocks an SM, 32 KiB in flight, 4 rows in L2).
constexpr int kUnroll = 4;

// What one load brings: a 16-byte vector (kN > 1) or one element (kN == 1).
template <typename T, int kN>
using Packed = std::conditional_t<kN == 1, T, uint4>;

// One coherent load of kN elements at p (16-byte aligned when kN > 1):
// kLastRead selects .cs (pass 2) over .cg (pass 1).
template <typename T, int kN, bool kLastRead>
__device__ __forceinline__ Packed<T, kN> LoadPacked(const T* p) {
  const auto* q = reinterpret_cast<const Packed<T, kN>*>(p);
  if constexpr (kLastRead) {
    return __ldcs(q);
  } else {
    return __ldcg(q);
  }
}

template <typename T, int kN>
__device__ __forceinline__ void Unpack(const Packed<T, kN>& raw, float (&f)[kN]) {
  if constexpr (kN == 1) {
    f[0] = ToFloat<T>(raw);
  } else {
    UnpackFloats<T>(raw, f);
  }
}

// The online-softmax state of a set of values: m = max, s = sum of exp(x - m).
// The empty set (and a set of -inf only) is {-inf, 0}.
struct MaxSum {
  float m;
  float s;
};

// exp(x - m) where m may be -inf: then every x folded so far is -inf too and
// its term is 0, where exp(-inf - -inf) would be NaN.
__device__ __forceinline__ float ShiftBase(float m) { return m == -INFINITY ? 0.f : m; }

// Folds kN values into a: the rescale (one expf) only when the maximum grows,
// which random logits do O(log n) times a thread. A NaN value makes s NaN; a
// +inf value gives m = inf and s NaN (torch's logsumexp would give inf).
template <int kN>
__device__ __forceinline__ void Fold(MaxSum& a, const float (&f)[kN]) {
  float mx = f[0];
#pragma unroll
  for (int i = 1; i < kN; ++i) mx = fmaxf(mx, f[i]);
  if (mx > a.m) {
    a.s *= expf(a.m - mx);  // a.m == -inf: a.s is 0 and stays 0
    a.m = mx;
  }
  const float base = ShiftBase(a.m);
#pragma unroll
  for (int i = 0; i < kN; ++i) a.s += expf(f[i] - base);
}

// s = s1 exp(m1 - m) + s2 exp(m2 - m), m = max(m1, m2).
__device__ __forceinline__ MaxSum Merge(const MaxSum& a, const MaxSum& b) {
  const float m = fmaxf(a.m, b.m);
  const float base = ShiftBase(m);
  return {m, a.s * expf(a.m - base) + b.s * expf(b.m - base)};
}

__device__ __forceinline__ MaxSum WarpMerge(MaxSum v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = Merge(v, other);
  }
  return v;
}

// log(sum over the block of exp(x)) from the threads' pairs, returned to every
// thread with the same bits: the lanes of a butterfly can differ in the last
// bit (the compiler may contract Merge's sum into an FMA on either product),
// so lane 0's value is broadcast, and every warp computes lane 0's value from
// the same shared data in the same order. blockDim.x must be a multiple of 32.
// `shared`: 2 x 32 floats.
__device__ __forceinline__ float BlockLogSumExp(MaxSum v, float* shared_m, float* shared_s) {
  v = WarpMerge(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // the previous row's readers are done with `shared`
  if (lane == 0) {
    shared_m[warp] = v.m;
    shared_s[warp] = v.s;
  }
  __syncthreads();
  MaxSum t{-INFINITY, 0.f};
  if (lane < static_cast<int>(blockDim.x / 32)) t = MaxSum{shared_m[lane], shared_s[lane]};
  t = WarpMerge(t);
  const float m = __shfl_sync(0xffffffffu, t.m, 0), s = __shfl_sync(0xffffffffu, t.s, 0);
  return m + logf(s);  // an all -inf row: -inf + log(0) = -inf, as torch.logsumexp
}

// kN == kVecElems<T>: the row as 16-byte vectors (logits 16-byte aligned,
// vocab % kN == 0); kN == 1: element by element. Item i of a row is elements
// [i * kN, i * kN + kN); thread t takes items t, t + blockDim.x, ...
template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    SoftmaxCrossEntropyKernel(T* __restrict__ logits, const int64_t* __restrict__ targets, float* __restrict__ loss,
                              int64_t rows, int vocab, int64_t ignore_index, bool write_grad) {
  __shared__ float shared_m[32], shared_s[32];
  const int items = vocab / kN;
  const int step = kUnroll * blockDim.x;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    T* x = logits + row * vocab;
    const int64_t target = targets[row];  // the same for every thread: the branches below are block-uniform
    if (target == ignore_index) {
      if (threadIdx.x == 0) loss[row] = 0.f;
      if (write_grad) {
        float zero[kN];
#pragma unroll
        for (int i = 0; i < kN; ++i) zero[i] = 0.f;
        for (int it = threadIdx.x; it < items; it += blockDim.x) StoreFloats<T, kN>(x + it * kN, zero);
      }
      continue;
    }
    const bool in_range = target >= 0 && target < vocab;
    const int t = in_range ? static_cast<int>(target) : -1;  // -1: no element gets the -1 of the one-hot
    float picked = 0.f;
    if (threadIdx.x == 0 && in_range) picked = ToFloat<T>(x[t]);

    // Pass 1: online max / sum of exp.
    MaxSum acc{-INFINITY, 0.f};
    for (int first = threadIdx.x; first < items; first += step) {
      Packed<T, kN> raw[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int it = first + k * blockDim.x;
        if (it < items) raw[k] = LoadPacked<T, kN, false>(x + it * kN);
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        if (first + k * blockDim.x < items) {
          float f[kN];
          Unpack<T, kN>(raw[k], f);
          Fold<kN>(acc, f);
        }
      }
    }
    const float lse = BlockLogSumExp(acc, shared_m, shared_s);
    if (threadIdx.x == 0) loss[row] = in_range ? lse - picked : __int_as_float(0x7fc00000);  // quiet NaN
    if (!write_grad) continue;

    // Pass 2: softmax - onehot, rounded once to T, over the row just read.
    for (int first = threadIdx.x; first < items; first += step) {
      Packed<T, kN> raw[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int it = first + k * blockDim.x;
        if (it < items) raw[k] = LoadPacked<T, kN, true>(x + it * kN);
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int it = first + k * blockDim.x;
        if (it < items) {
          float f[kN];
          Unpack<T, kN>(raw[k], f);
#pragma unroll
          for (int i = 0; i < kN; ++i) f[i] = expf(f[i] - lse) - (it * kN + i == t ? 1.f : 0.f);
          StoreFloats<T, kN>(x + it * kN, f);
        }
      }
    }
  }
}

int64_t RoundUp32(int64_t n) { return (n + 31) / 32 * 32; }

}  // namespace

std::string SoftmaxCrossEntropyRows(void* logits, const int64_t* targets, float* loss, int64_t rows, int64_t vocab,
                                    int64_t ignore_index, bool write_grad, DType dtype, void* stream) {
  if (rows < 0 || vocab <= 0 || vocab > INT_MAX / 2) {
    return "SoftmaxCrossEntropyRows: bad sizes rows=" + std::to_string(rows) + " vocab=" + std::to_string(vocab);
  }
  if (rows == 0) return {};
  if (!logits || !targets || !loss) return "SoftmaxCrossEntropyRows: a null pointer";
  return DispatchDType(dtype, [&](auto tag) -> std::string {
    using T = decltype(tag);
    constexpr int kN = kVecElems<T>;
    T* x = static_cast<T*>(logits);
    const int v = static_cast<int>(vocab);
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(rows, INT_MAX));
    const cudaStream_t s = AsStream(stream);
    if (Aligned16(logits) && vocab % kN == 0) {
      // A multiple of 32 (the reductions' shuffles), no more than the row's vectors need.
      const int threads = static_cast<int>(std::min<int64_t>(kThreads, RoundUp32(vocab / kN)));
      SoftmaxCrossEntropyKernel<T, kN><<<grid, threads, 0, s>>>(x, targets, loss, rows, v, ignore_index, write_grad);
    } else {
      const int threads = static_cast<int>(std::min<int64_t>(kThreads, RoundUp32(vocab)));
      SoftmaxCrossEntropyKernel<T, 1><<<grid, threads, 0, s>>>(x, targets, loss, rows, v, ignore_index, write_grad);
    }
    return LaunchError("SoftmaxCrossEntropyRows");
  });
}

}  // namespace trainerd::kernels
