// Products with one thin side on tensor cores (contract in thin_products.h).
//
// Both kernels stream the large operand through shared memory in 64-wide
// tiles (cp.async, kStages deep, zero-filled past the edges) and multiply with
// mma.sync m16n8k16 (16-bit inputs, float32 accumulators), fragments loaded
// by ldmatrix. Shared rows carry kPad elements of padding so that ldmatrix's
// eight row addresses fall on distinct banks.
//
//   ThinRight: y (m, r) = x (m, k) w^T. A block owns 64 rows of x (warp w: 16
//   of them) and all r columns, and sums over its range of k.
//   ThinLeft:  z (r, n) = t^T g. A block owns 64 columns of g and all r rows,
//   and sums over its range of m; warp (wn, wk) takes 32 of the columns and
//   32 of each tile's 64 rows, the two row halves added at the end in a fixed
//   order through shared memory.
//
// A block writes its sums to the output (rounded once), or, when the long sum
// is split over blocks, as float32 partials that SumSplits adds in split order.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <tuple>
#include <type_traits>
#include <utility>

#include "engine/kernels/dtype_access.cuh"
#include "engine/kernels/thin_products.h"

namespace trainerd::kernels {
namespace {

using namespace detail;  // NOLINT(build/namespaces)

constexpr int kStages = 4;
constexpr int kPad = 8;  // elements after each shared row: ldmatrix's eight rows on distinct banks

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared memory, asynchronously; only `bytes` of them
// are read (0 to 16), the rest of the 16 written as zeros.
__device__ __forceinline__ void CopyAsync16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void CommitAsync() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void WaitAsync() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 matrices of 16-bit elements, lane l giving the address of row l % 8
// of matrix l / 8; transposed: each lane gets a column pair instead of a row's.
__device__ __forceinline__ void LoadMatrices(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}
__device__ __forceinline__ void LoadMatricesTransposed(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}

// d (16x8, float32) += a (16x16) b (16x8).
template <typename T>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void Mma<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void Mma<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

// The bytes of the 8 elements at `from` that lie before `end` (0 to 16).
__device__ __forceinline__ int BytesBefore(int64_t from, int64_t end) {
  return from < end ? static_cast<int>(Min64(8, end - from)) * 2 : 0;
}

// The stages' loop of both kernels: load(tile, stage) issues the cp.async
// copies of one tile into one stage, kStages - 1 tiles ahead of
// compute(stage), which reads the stage once its copies have landed. Every
// copy has landed when it returns.
template <typename Load, typename Compute>
__device__ __forceinline__ void Pipeline(int tiles, Load&& load, Compute&& compute) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) load(s, s);
    CommitAsync();
  }
  for (int tile = 0; tile < tiles; ++tile) {
    WaitAsync<kStages - 2>();
    __syncthreads();
    compute(tile % kStages);
    const int next = tile + kStages - 1;
    if (next < tiles) load(next, next % kStages);
    CommitAsync();
  }
  WaitAsync<0>();
}

// A block's shape: it owns kBig rows of x (right) or columns of g (left), and
// each stage holds kSum terms of the long sum; kWarpsBig x kWarpsSum warps,
// warp (wb, ws) taking kWarpBig of the kBig and kWarpSum of each stage's
// kSum (the sums of a second warp along the sum added at the end, in a fixed
// order).
template <int kBigV, int kSumV, int kWarpsBigV, int kWarpsSumV>
struct Shape {
  static constexpr int kBig = kBigV, kSum = kSumV, kWarpsBig = kWarpsBigV, kWarpsSum = kWarpsSumV;
  static constexpr int kThreads = 32 * kWarpsBig * kWarpsSum;
  static constexpr int kWarpBig = kBig / kWarpsBig, kWarpSum = kSum / kWarpsSum;
  static_assert(kWarpBig % 16 == 0 && kWarpSum % 16 == 0, "warp tiles of whole 16x16 fragments");
  static_assert(kWarpsSum == 1 || kWarpsSum == 2, "at most two warps along the sum");
};

// The float32 sums of the warps with ws = 1 added to those of ws = 0 through
// shared memory (kWarpsBig x kPerLane x 32 floats from its start, after the
// stages are done with). Returns whether this warp holds the block's sums.
template <typename S, int kPerLane>
__device__ __forceinline__ bool AddSecondHalf(float (&acc)[kPerLane], unsigned char* shared, int wb, int ws,
                                              int lane) {
  if constexpr (S::kWarpsSum == 1) {
    return true;
  } else {
    float* mine = reinterpret_cast<float*>(shared) + wb * (kPerLane * 32);
    __syncthreads();
    if (ws == 1) {
#pragma unroll
      for (int q = 0; q < kPerLane; ++q) mine[q * 32 + lane] = acc[q];
    }
    __syncthreads();
    if (ws == 1) return false;
#pragma unroll
    for (int q = 0; q < kPerLane; ++q) acc[q] += mine[q * 32 + lane];
    return true;
  }
}

// One m16n8k16 product into the 4 accumulators at acc.
template <typename T>
__device__ __forceinline__ void MmaAt(float* acc, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Mma<T>(*reinterpret_cast<float(*)[4]>(acc), a, b0, b1);
}

// ---- y = x w^T -------------------------------------------------------------
// kNp: r rounded up to an even number of 8-column mma tiles (2, 4, 6, 8).
// kWRows: w's rows contiguous (shared tile [r][k]), else its columns ([k][r]).
template <typename S, int kNp, bool kWRows>
struct RightLayout {
  static constexpr int kXRow = S::kSum + kPad;
  static constexpr int kXElems = S::kBig * kXRow;
  static constexpr int kWRow = kWRows ? S::kSum + kPad : kNp * 8 + kPad;
  static constexpr int kWElems = kWRows ? kNp * 8 * kWRow : S::kSum * kWRow;
  static constexpr int kStageElems = kXElems + kWElems;
  static constexpr int kPerLane = (S::kWarpBig / 16) * kNp * 4;
  static constexpr size_t kSharedBytes = size_t{kStages} * kStageElems * 2;
  static_assert(size_t{S::kWarpsBig} * kPerLane * 32 * 4 <= kSharedBytes, "the exchange fits");
};

template <typename T, typename S, int kNp, bool kWRows>
__global__ void __launch_bounds__(S::kThreads)
    ThinRightKernel(const T* __restrict__ x, int64_t x_ld, const T* __restrict__ w, int64_t w_stride_r,
                    int64_t w_stride_k, T* __restrict__ y, int64_t y_ld, float* __restrict__ partial, int64_t m,
                    int64_t k, int64_t r, int64_t k_per_split) {
  using L = RightLayout<S, kNp, kWRows>;
  constexpr int kMt = S::kWarpBig / 16;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* shared = reinterpret_cast<T*>(shared_bytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wb = warp % S::kWarpsBig, ws = warp / S::kWarpsBig;
  const int64_t m0 = int64_t{blockIdx.x} * S::kBig;
  const int64_t k_begin = int64_t{blockIdx.y} * k_per_split;
  const int64_t k_end = Min64(k, k_begin + k_per_split);
  const int tiles = static_cast<int>((k_end - k_begin + S::kSum - 1) / S::kSum);

  auto load = [&](int tile, int stage) {
    T* xs = shared + stage * L::kStageElems;
    T* wt = xs + L::kXElems;
    const int64_t k0 = k_begin + int64_t{tile} * S::kSum;
    constexpr int kChunks = S::kSum / 8;  // 16-byte chunks of a row's stage
    for (int c = threadIdx.x; c < S::kBig * kChunks; c += S::kThreads) {
      const int row = c / kChunks, col = (c % kChunks) * 8;
      const int bytes = m0 + row < m ? BytesBefore(k0 + col, k_end) : 0;
      CopyAsync16(xs + row * L::kXRow + col, bytes > 0 ? x + (m0 + row) * x_ld + k0 + col : x, bytes);
    }
    if constexpr (kWRows) {
      for (int c = threadIdx.x; c < kNp * 8 * kChunks; c += S::kThreads) {
        const int row = c / kChunks, col = (c % kChunks) * 8;
        const int bytes = row < r ? BytesBefore(k0 + col, k_end) : 0;
        CopyAsync16(wt + row * L::kWRow + col, bytes > 0 ? w + row * w_stride_r + k0 + col : w, bytes);
      }
    } else {
      for (int c = threadIdx.x; c < S::kSum * kNp; c += S::kThreads) {
        const int row = c / kNp, col = (c % kNp) * 8;
        const int bytes = k0 + row < k_end ? BytesBefore(col, r) : 0;
        CopyAsync16(wt + row * L::kWRow + col, bytes > 0 ? w + (k0 + row) * w_stride_k + col : w, bytes);
      }
    }
  };

  float acc[L::kPerLane] = {};
  Pipeline(tiles, load, [&](int stage) {
    const T* xs = shared + stage * L::kStageElems;
    const T* wt = xs + L::kXElems;
#pragma unroll
    for (int ks = 0; ks < S::kWarpSum / 16; ++ks) {
      const int kk = ws * S::kWarpSum + ks * 16;
      uint32_t b[kNp / 2][4];
#pragma unroll
      for (int p = 0; p < kNp / 2; ++p) {
        if constexpr (kWRows) {
          LoadMatrices(b[p], wt + (p * 16 + lane % 8 + (lane / 16) * 8) * L::kWRow + kk + ((lane / 8) % 2) * 8);
        } else {
          LoadMatricesTransposed(b[p], wt + (kk + lane % 8 + ((lane / 8) % 2) * 8) * L::kWRow + p * 16 +
                                           (lane / 16) * 8);
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        uint32_t a[4];
        LoadMatrices(a, xs + (wb * S::kWarpBig + mt * 16 + lane % 16) * L::kXRow + kk + (lane / 16) * 8);
#pragma unroll
        for (int p = 0; p < kNp / 2; ++p) {
          MmaAt<T>(&acc[(mt * kNp + 2 * p) * 4], a, b[p][0], b[p][1]);
          MmaAt<T>(&acc[(mt * kNp + 2 * p + 1) * 4], a, b[p][2], b[p][3]);
        }
      }
    }
  });
  if (!AddSecondHalf<S>(acc, shared_bytes, wb, ws, lane)) return;

  // Accumulator (mt, nt, i): row mt * 16 + lane / 4 (+ 8 for i >= 2) of the
  // warp's, column nt * 8 + 2 (lane % 4) + i % 2.
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNp; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t row = m0 + wb * S::kWarpBig + mt * 16 + lane / 4 + (i / 2) * 8;
        const int64_t col = nt * 8 + 2 * (lane % 4) + i % 2;
        if (row >= m || col >= r) continue;
        const float v = acc[(mt * kNp + nt) * 4 + i];
        if (partial != nullptr) {
          partial[(int64_t{blockIdx.y} * m + row) * r + col] = v;
        } else {
          y[row * y_ld + col] = FromFloat<T>(v);
        }
      }
    }
  }
}

// ---- z = t^T g -------------------------------------------------------------
// kMt: r in 16-row mma tiles (1 to 4).
template <typename S, int kMt>
struct LeftLayout {
  static constexpr int kTRow = kMt * 16 + kPad;
  static constexpr int kTElems = S::kSum * kTRow;
  static constexpr int kGRow = S::kBig + kPad;
  static constexpr int kStageElems = kTElems + S::kSum * kGRow;
  static constexpr int kPerLane = kMt * (S::kWarpBig / 8) * 4;
  static constexpr size_t kSharedBytes = size_t{kStages} * kStageElems * 2;
  static_assert(size_t{S::kWarpsBig} * kPerLane * 32 * 4 <= kSharedBytes, "the exchange fits");
};

template <typename T, typename S, int kMt>
__global__ void __launch_bounds__(S::kThreads)
    ThinLeftKernel(const T* __restrict__ t, int64_t t_ld, const T* __restrict__ g, int64_t g_ld, T* __restrict__ z,
                   int64_t z_ld, float* __restrict__ partial, int64_t m, int64_t r, int64_t n,
                   int64_t m_per_split) {
  using L = LeftLayout<S, kMt>;
  constexpr int kNt = S::kWarpBig / 8;  // 8-column tiles of a warp
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* shared = reinterpret_cast<T*>(shared_bytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wb = warp % S::kWarpsBig, ws = warp / S::kWarpsBig;
  const int64_t n0 = int64_t{blockIdx.x} * S::kBig;
  const int64_t m_begin = int64_t{blockIdx.y} * m_per_split;
  const int64_t m_end = Min64(m, m_begin + m_per_split);
  const int tiles = static_cast<int>((m_end - m_begin + S::kSum - 1) / S::kSum);

  auto load = [&](int tile, int stage) {
    T* ts = shared + stage * L::kStageElems;
    T* gs = ts + L::kTElems;
    const int64_t row0 = m_begin + int64_t{tile} * S::kSum;
    for (int c = threadIdx.x; c < S::kSum * 2 * kMt; c += S::kThreads) {
      const int row = c / (2 * kMt), col = (c % (2 * kMt)) * 8;
      const int bytes = row0 + row < m_end ? BytesBefore(col, r) : 0;
      CopyAsync16(ts + row * L::kTRow + col, bytes > 0 ? t + (row0 + row) * t_ld + col : t, bytes);
    }
    constexpr int kChunks = S::kBig / 8;
    for (int c = threadIdx.x; c < S::kSum * kChunks; c += S::kThreads) {
      const int row = c / kChunks, col = (c % kChunks) * 8;
      const int bytes = row0 + row < m_end ? BytesBefore(n0 + col, n) : 0;
      CopyAsync16(gs + row * L::kGRow + col, bytes > 0 ? g + (row0 + row) * g_ld + n0 + col : g, bytes);
    }
  };

  float acc[L::kPerLane] = {};
  Pipeline(tiles, load, [&](int stage) {
    const T* ts = shared + stage * L::kStageElems;
    const T* gs = ts + L::kTElems;
#pragma unroll
    for (int ks = 0; ks < S::kWarpSum / 16; ++ks) {
      const int kk = ws * S::kWarpSum + ks * 16;
      uint32_t b[kNt / 2][4];
#pragma unroll
      for (int p = 0; p < kNt / 2; ++p) {
        LoadMatricesTransposed(b[p], gs + (kk + lane % 8 + ((lane / 8) % 2) * 8) * L::kGRow + wb * S::kWarpBig +
                                         p * 16 + (lane / 16) * 8);
      }
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        uint32_t a[4];
        LoadMatricesTransposed(a, ts + (kk + lane % 8 + (lane / 16) * 8) * L::kTRow + mt * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
        for (int p = 0; p < kNt / 2; ++p) {
          MmaAt<T>(&acc[(mt * kNt + 2 * p) * 4], a, b[p][0], b[p][1]);
          MmaAt<T>(&acc[(mt * kNt + 2 * p + 1) * 4], a, b[p][2], b[p][3]);
        }
      }
    }
  });
  if (!AddSecondHalf<S>(acc, shared_bytes, wb, ws, lane)) return;

  // Accumulator (mt, nt, i): row mt * 16 + lane / 4 (+ 8 for i >= 2) of z,
  // column nt * 8 + 2 (lane % 4) + i % 2 of the warp's.
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t row = mt * 16 + lane / 4 + (i / 2) * 8;
        const int64_t col = n0 + wb * S::kWarpBig + nt * 8 + 2 * (lane % 4) + i % 2;
        if (row >= r || col >= n) continue;
        const float v = acc[(mt * kNt + nt) * 4 + i];
        if (partial != nullptr) {
          partial[(int64_t{blockIdx.y} * r + row) * n + col] = v;
        } else {
          z[row * z_ld + col] = FromFloat<T>(v);
        }
      }
    }
  }
}

// out (rows, cols; rows out_ld apart) = the sum of `splits` dense float32
// (rows, cols) partials, added in split order.
template <typename T>
__global__ void __launch_bounds__(256) SumSplitsKernel(const float* __restrict__ partial, int splits, int64_t rows,
                                                       int64_t cols, T* __restrict__ out, int64_t out_ld) {
  const int64_t total = rows * cols;
  for (int64_t e = blockIdx.x * int64_t{256} + threadIdx.x; e < total; e += int64_t{gridDim.x} * 256) {
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) sum += partial[s * total + e];
    out[(e / cols) * out_ld + e % cols] = FromFloat<T>(sum);
  }
}

// The current device's SM count and shared memory per SM, looked up once per device.
struct DeviceSize {
  int sms = 132;
  int shared_per_sm = 233472;
};
DeviceSize CurrentDevice() {
  static std::array<std::atomic<int>, 64> sms{}, shared{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) return {};
  device = std::min(device, static_cast<int>(sms.size()) - 1);
  if (sms[device].load() == 0) {
    DeviceSize d;
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) == cudaSuccess && v > 0) {
      d.shared_per_sm = v;
    }
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && v > 0) d.sms = v;
    shared[device].store(d.shared_per_sm);
    sms[device].store(d.sms);
  }
  DeviceSize d;
  d.sms = sms[device].load();
  d.shared_per_sm = shared[device].load();
  return d;
}

// How a sum of `length` terms is split when the output gives `blocks` blocks
// of shape S using `shared_bytes`: {splits, terms a split (whole stages)}.
// Enough blocks for two full waves of the GPU, each split at least four
// stages long.
template <typename S>
std::pair<int, int64_t> Splits(int64_t blocks, int64_t length, size_t shared_bytes) {
  const DeviceSize d = CurrentDevice();
  const int64_t per_sm = std::max<int64_t>(
      1, std::min<int64_t>(d.shared_per_sm / static_cast<int64_t>(shared_bytes + 1024), 2048 / S::kThreads));
  const int64_t wanted = (2 * d.sms * per_sm + blocks - 1) / blocks;
  const int64_t most = std::max<int64_t>(1, (length + 4 * S::kSum - 1) / (4 * S::kSum));
  const int64_t splits = std::clamp<int64_t>(std::min(wanted, most), 1, kMaxThinSplits);
  const int64_t stages = (length + S::kSum - 1) / S::kSum;
  const int64_t per_split = ((stages + splits - 1) / splits) * S::kSum;
  return {static_cast<int>((length + per_split - 1) / per_split), per_split};
}

bool Is16Bit(DType dtype) { return dtype == DType::kBFloat16 || dtype == DType::kFloat16; }

// Raises a kernel's dynamic shared memory limit to what it uses.
template <typename Kernel>
bool AllowShared(Kernel kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) ==
         cudaSuccess;
}

template <typename T>
std::string SumSplits(const float* partial, int splits, int64_t rows, int64_t cols, void* out, int64_t out_ld,
                      cudaStream_t stream, const char* what) {
  const int64_t blocks = std::min<int64_t>((rows * cols + 255) / 256, 4 * int64_t{CurrentDevice().sms});
  SumSplitsKernel<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(partial, splits, rows, cols,
                                                                         static_cast<T*>(out), out_ld);
  return LaunchError(what);
}

// The block shapes (TRAINERD_THIN_VARIANT="right,left" picks others, for tuning).
using RightShapes = std::tuple<Shape<64, 64, 4, 1>, Shape<128, 64, 4, 2>, Shape<128, 64, 8, 1>, Shape<256, 64, 8, 1>,
                               Shape<128, 128, 4, 1>>;
using LeftShapes = std::tuple<Shape<64, 64, 2, 2>, Shape<128, 64, 4, 2>, Shape<256, 32, 8, 1>, Shape<128, 32, 4, 1>,
                              Shape<256, 64, 8, 1>>;
int Variant(bool right) {
  static const std::pair<int, int> chosen = [] {
    std::pair<int, int> v{0, 0};
    if (const char* e = std::getenv("TRAINERD_THIN_VARIANT")) std::sscanf(e, "%d,%d", &v.first, &v.second);
    return v;
  }();
  return right ? chosen.first : chosen.second;
}

// f(S{}) for the variant-th shape of Shapes (the first when out of range).
template <typename Shapes, typename F, size_t... I>
auto WithShapeOf(int variant, F&& f, std::index_sequence<I...>) {
  using Result = decltype(f(std::tuple_element_t<0, Shapes>{}));
  Result result{};
  const bool done = ((variant == static_cast<int>(I) ? (result = f(std::tuple_element_t<I, Shapes>{}), true)
                                                     : false) || ...);
  if (!done) result = f(std::tuple_element_t<0, Shapes>{});
  return result;
}
template <typename Shapes, typename F>
auto WithShape(int variant, F&& f) {
  return WithShapeOf<Shapes>(variant, std::forward<F>(f), std::make_index_sequence<std::tuple_size_v<Shapes>>{});
}

// f(std::integral_constant<int, v>{}) for v = n in {2, 4, 6, 8} (np) or {1, 2, 3, 4} (mt).
template <int kFirst, int kStep, typename F>
auto WithCount(int n, F&& f) {
  switch ((n - kFirst) / kStep) {
    case 0:
      return f(std::integral_constant<int, kFirst>{});
    case 1:
      return f(std::integral_constant<int, kFirst + kStep>{});
    case 2:
      return f(std::integral_constant<int, kFirst + 2 * kStep>{});
    default:
      return f(std::integral_constant<int, kFirst + 3 * kStep>{});
  }
}

// {splits, terms a split} of y (m, r) = x w^T with shape S (the shared memory of w's row layout).
template <typename S>
std::pair<int, int64_t> RightPlan(int64_t m, int64_t k, int np) {
  const size_t bytes =
      WithCount<2, 2>(np, [](auto c) { return RightLayout<S, decltype(c)::value, true>::kSharedBytes; });
  return Splits<S>((m + S::kBig - 1) / S::kBig, k, bytes);
}
template <typename S>
std::pair<int, int64_t> LeftPlan(int64_t m, int64_t n, int mt) {
  const size_t bytes = WithCount<1, 1>(mt, [](auto c) { return LeftLayout<S, decltype(c)::value>::kSharedBytes; });
  return Splits<S>((n + S::kBig - 1) / S::kBig, m, bytes);
}

int RightTiles(int64_t r) { return static_cast<int>(((r + 15) / 16) * 2); }  // 8-column tiles, even
int LeftTiles(int64_t r) { return static_cast<int>((r + 15) / 16); }        // 16-row tiles

template <typename T, typename S, int kNp, bool kWRows>
std::string LaunchRight(const void* x, int64_t x_ld, const void* w, int64_t w_stride_r, int64_t w_stride_k, void* y,
                        int64_t y_ld, int64_t m, int64_t k, int64_t r, float* workspace, cudaStream_t stream) {
  using L = RightLayout<S, kNp, kWRows>;
  const auto [splits, per_split] = RightPlan<S>(m, k, kNp);
  const auto kernel = ThinRightKernel<T, S, kNp, kWRows>;
  if (!AllowShared(kernel, L::kSharedBytes)) return LaunchError("ThinRightProduct");
  const dim3 grid(static_cast<unsigned>((m + S::kBig - 1) / S::kBig), static_cast<unsigned>(splits));
  kernel<<<grid, S::kThreads, L::kSharedBytes, stream>>>(
      static_cast<const T*>(x), x_ld, static_cast<const T*>(w), w_stride_r, w_stride_k, static_cast<T*>(y), y_ld,
      splits > 1 ? workspace : nullptr, m, k, r, per_split);
  std::string error = LaunchError("ThinRightProduct");
  if (error.empty() && splits > 1) error = SumSplits<T>(workspace, splits, m, r, y, y_ld, stream, "ThinRightProduct");
  return error;
}

template <typename T, typename S, int kMt>
std::string LaunchLeft(const void* t, int64_t t_ld, const void* g, int64_t g_ld, void* z, int64_t z_ld, int64_t m,
                       int64_t r, int64_t n, float* workspace, cudaStream_t stream) {
  using L = LeftLayout<S, kMt>;
  const auto [splits, per_split] = LeftPlan<S>(m, n, kMt);
  const auto kernel = ThinLeftKernel<T, S, kMt>;
  if (!AllowShared(kernel, L::kSharedBytes)) return LaunchError("ThinLeftProduct");
  const dim3 grid(static_cast<unsigned>((n + S::kBig - 1) / S::kBig), static_cast<unsigned>(splits));
  kernel<<<grid, S::kThreads, L::kSharedBytes, stream>>>(static_cast<const T*>(t), t_ld, static_cast<const T*>(g),
                                                         g_ld, static_cast<T*>(z), z_ld,
                                                         splits > 1 ? workspace : nullptr, m, r, n, per_split);
  std::string error = LaunchError("ThinLeftProduct");
  if (error.empty() && splits > 1) error = SumSplits<T>(workspace, splits, r, n, z, z_ld, stream, "ThinLeftProduct");
  return error;
}

// "" when the sizes and the 16-bit dtype suit the launchers, else why not.
std::string CheckSizes(const char* what, int64_t large1, int64_t large2, int64_t r, DType dtype) {
  if (!Is16Bit(dtype)) return std::string(what) + ": float16 or bfloat16 only";
  if (large1 < 0 || large2 < 0 || r < 0) return std::string(what) + ": negative size";
  if (r > kMaxThinRank) {
    return std::string(what) + ": thin side " + std::to_string(r) + " wider than " + std::to_string(kMaxThinRank);
  }
  return {};
}

}  // namespace

bool ThinProductLayoutOk(const void* p, int64_t ld) { return p != nullptr && Aligned16(p) && ld > 0 && ld % 8 == 0; }

size_t ThinRightProductWorkspaceBytes(int64_t m, int64_t k, int64_t r) {
  if (m <= 0 || k <= 0 || r <= 0 || r > kMaxThinRank) return 0;
  const int splits = WithShape<RightShapes>(Variant(true), [&](auto shape) {
    return RightPlan<decltype(shape)>(m, k, RightTiles(r)).first;
  });
  return splits > 1 ? static_cast<size_t>(splits) * m * r * sizeof(float) : 0;
}

size_t ThinLeftProductWorkspaceBytes(int64_t m, int64_t r, int64_t n) {
  if (m <= 0 || r <= 0 || n <= 0 || r > kMaxThinRank) return 0;
  const int splits = WithShape<LeftShapes>(Variant(false), [&](auto shape) {
    return LeftPlan<decltype(shape)>(m, n, LeftTiles(r)).first;
  });
  return splits > 1 ? static_cast<size_t>(splits) * r * n * sizeof(float) : 0;
}

std::string ThinRightProduct(const void* x, int64_t x_ld, const void* w, int64_t w_stride_r, int64_t w_stride_k,
                             void* y, int64_t y_ld, int64_t m, int64_t k, int64_t r, float* workspace,
                             size_t workspace_bytes, DType dtype, void* stream) {
  if (std::string error = CheckSizes("ThinRightProduct", m, k, r, dtype); !error.empty()) return error;
  if (m == 0 || r == 0) return {};
  const bool w_rows = w_stride_k == 1;
  if (!ThinProductLayoutOk(x, x_ld) || !ThinProductLayoutOk(w, w_rows ? w_stride_r : w_stride_k) ||
      (!w_rows && w_stride_r != 1) || x_ld < k || y == nullptr || y_ld < r) {
    return "ThinRightProduct: x, w or y not laid out as thin_products.h asks (16-byte aligned pointers, row "
           "distances a multiple of 8, x_ld >= k, one unit stride of w, y_ld >= r)";
  }
  if (workspace_bytes < ThinRightProductWorkspaceBytes(m, k, r) || (workspace_bytes > 0 && workspace == nullptr)) {
    return "ThinRightProduct: workspace smaller than ThinRightProductWorkspaceBytes";
  }
  if (k == 0) return "ThinRightProduct: k is 0 (nothing to sum: the caller zeroes y)";
  const cudaStream_t s = AsStream(stream);
  return WithShape<RightShapes>(Variant(true), [&](auto shape) {
    using S = decltype(shape);
    return WithCount<2, 2>(RightTiles(r), [&](auto np) {
      constexpr int kNp = decltype(np)::value;
      if (dtype == DType::kBFloat16) {
        return w_rows ? LaunchRight<__nv_bfloat16, S, kNp, true>(x, x_ld, w, w_stride_r, 1, y, y_ld, m, k, r,
                                                                 workspace, s)
                      : LaunchRight<__nv_bfloat16, S, kNp, false>(x, x_ld, w, 1, w_stride_k, y, y_ld, m, k, r,
                                                                  workspace, s);
      }
      return w_rows ? LaunchRight<__half, S, kNp, true>(x, x_ld, w, w_stride_r, 1, y, y_ld, m, k, r, workspace, s)
                    : LaunchRight<__half, S, kNp, false>(x, x_ld, w, 1, w_stride_k, y, y_ld, m, k, r, workspace, s);
    });
  });
}

std::string ThinLeftProduct(const void* t, int64_t t_ld, const void* g, int64_t g_ld, void* z, int64_t z_ld,
                            int64_t m, int64_t r, int64_t n, float* workspace, size_t workspace_bytes, DType dtype,
                            void* stream) {
  if (std::string error = CheckSizes("ThinLeftProduct", n, m, r, dtype); !error.empty()) return error;
  if (r == 0 || n == 0) return {};
  if (!ThinProductLayoutOk(t, t_ld) || !ThinProductLayoutOk(g, g_ld) || t_ld < r || g_ld < n || z == nullptr ||
      z_ld < n) {
    return "ThinLeftProduct: t, g or z not laid out as thin_products.h asks (16-byte aligned pointers, row "
           "distances a multiple of 8 and at least the row)";
  }
  if (workspace_bytes < ThinLeftProductWorkspaceBytes(m, r, n) || (workspace_bytes > 0 && workspace == nullptr)) {
    return "ThinLeftProduct: workspace smaller than ThinLeftProductWorkspaceBytes";
  }
  if (m == 0) return "ThinLeftProduct: m is 0 (nothing to sum: the caller zeroes z)";
  const cudaStream_t s = AsStream(stream);
  return WithShape<LeftShapes>(Variant(false), [&](auto shape) {
    using S = decltype(shape);
    return WithCount<1, 1>(LeftTiles(r), [&](auto mt) {
      constexpr int kMt = decltype(mt)::value;
      return dtype == DType::kBFloat16
                 ? LaunchLeft<__nv_bfloat16, S, kMt>(t, t_ld, g, g_ld, z, z_ld, m, r, n, workspace, s)
                 : LaunchLeft<__half, S, kMt>(t, t_ld, g, g_ld, z, z_ld, m, r, n, workspace, s);
    });
  });
}

}  // namespace trainerd::kernels
