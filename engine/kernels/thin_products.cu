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

#include "engine/kernels/dtype_access.cuh"
#include "engine/kernels/thin_products.h"

namespace trainerd::kernels {
namespace {

using namespace detail;  // NOLINT(build/namespaces)

constexpr int kThreads = 128;  // 4 warps
constexpr int kTile = 64;      // a block's extent along the large output side, and a stage's along the sum
constexpr int kStages = 4;
constexpr int kPad = 8;
constexpr int kRow = kTile + kPad;  // a shared row of a 64-wide tile

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

// ---- y = x w^T -------------------------------------------------------------
// kNp: r rounded up to an even number of 8-column mma tiles (2, 4, 6, 8).
// kWRows: w's rows contiguous (shared tile [r][k]), else its columns ([k][r]).
template <int kNp, bool kWRows>
struct RightLayout {
  static constexpr int kXElems = kTile * kRow;
  static constexpr int kWRow = kWRows ? kRow : kNp * 8 + kPad;
  static constexpr int kWElems = kWRows ? kNp * 8 * kRow : kTile * kWRow;
  static constexpr int kStageElems = kXElems + kWElems;
  static constexpr size_t kSharedBytes = size_t{kStages} * kStageElems * 2;
};

template <typename T, int kNp, bool kWRows>
__global__ void __launch_bounds__(kThreads)
    ThinRightKernel(const T* __restrict__ x, int64_t x_ld, const T* __restrict__ w, int64_t w_stride_r,
                    int64_t w_stride_k, T* __restrict__ y, int64_t y_ld, float* __restrict__ partial, int64_t m,
                    int64_t k, int64_t r, int64_t k_per_split) {
  using L = RightLayout<kNp, kWRows>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* shared = reinterpret_cast<T*>(shared_bytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t m0 = int64_t{blockIdx.x} * kTile;
  const int64_t k_begin = int64_t{blockIdx.y} * k_per_split;
  const int64_t k_end = Min64(k, k_begin + k_per_split);
  const int tiles = static_cast<int>((k_end - k_begin + kTile - 1) / kTile);

  auto load = [&](int tile, int stage) {
    T* xs = shared + stage * L::kStageElems;
    T* ws = xs + L::kXElems;
    const int64_t k0 = k_begin + int64_t{tile} * kTile;
    for (int c = threadIdx.x; c < kTile * 8; c += kThreads) {
      const int row = c / 8, col = (c % 8) * 8;
      const int bytes = m0 + row < m ? BytesBefore(k0 + col, k_end) : 0;
      CopyAsync16(xs + row * kRow + col, bytes > 0 ? x + (m0 + row) * x_ld + k0 + col : x, bytes);
    }
    if constexpr (kWRows) {
      for (int c = threadIdx.x; c < kNp * 8 * 8; c += kThreads) {
        const int row = c / 8, col = (c % 8) * 8;
        const int bytes = row < r ? BytesBefore(k0 + col, k_end) : 0;
        CopyAsync16(ws + row * kRow + col, bytes > 0 ? w + row * w_stride_r + k0 + col : w, bytes);
      }
    } else {
      for (int c = threadIdx.x; c < kTile * kNp; c += kThreads) {
        const int row = c / kNp, col = (c % kNp) * 8;
        const int bytes = k0 + row < k_end ? BytesBefore(col, r) : 0;
        CopyAsync16(ws + row * L::kWRow + col, bytes > 0 ? w + (k0 + row) * w_stride_k + col : w, bytes);
      }
    }
  };

  float acc[kNp][4] = {};
  Pipeline(tiles, load, [&](int stage) {
    const T* xs = shared + stage * L::kStageElems;
    const T* ws = xs + L::kXElems;
#pragma unroll
    for (int kk = 0; kk < kTile; kk += 16) {
      uint32_t a[4];
      LoadMatrices(a, xs + (warp * 16 + lane % 16) * kRow + kk + (lane / 16) * 8);
#pragma unroll
      for (int p = 0; p < kNp / 2; ++p) {
        uint32_t b[4];
        if constexpr (kWRows) {
          LoadMatrices(b, ws + (p * 16 + lane % 8 + (lane / 16) * 8) * kRow + kk + ((lane / 8) % 2) * 8);
        } else {
          LoadMatricesTransposed(b, ws + (kk + lane % 8 + ((lane / 8) % 2) * 8) * L::kWRow + p * 16 + (lane / 16) * 8);
        }
        Mma<T>(acc[2 * p], a, b[0], b[1]);
        Mma<T>(acc[2 * p + 1], a, b[2], b[3]);
      }
    }
  });

  // Accumulator (tile nt, i): row lane / 4 (+ 8 for i >= 2), column 2 (lane % 4) + i % 2.
#pragma unroll
  for (int nt = 0; nt < kNp; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = m0 + warp * 16 + lane / 4 + (i / 2) * 8;
      const int64_t col = nt * 8 + 2 * (lane % 4) + i % 2;
      if (row >= m || col >= r) continue;
      if (partial != nullptr) {
        partial[(int64_t{blockIdx.y} * m + row) * r + col] = acc[nt][i];
      } else {
        y[row * y_ld + col] = FromFloat<T>(acc[nt][i]);
      }
    }
  }
}

// ---- z = t^T g -------------------------------------------------------------
// kMt: r in 16-row mma tiles (1 to 4).
template <int kMt>
struct LeftLayout {
  static constexpr int kTRow = kMt * 16 + kPad;
  static constexpr int kTElems = kTile * kTRow;
  static constexpr int kStageElems = kTElems + kTile * kRow;
  static constexpr size_t kSharedBytes = size_t{kStages} * kStageElems * 2;
  // The row halves' sums exchanged at the end: float [2 column halves][kMt * 16][32 lanes].
  static_assert(2 * kMt * 16 * 32 * 4 <= kSharedBytes, "the exchange fits in the stages' memory");
};

template <typename T, int kMt>
__global__ void __launch_bounds__(kThreads)
    ThinLeftKernel(const T* __restrict__ t, int64_t t_ld, const T* __restrict__ g, int64_t g_ld, T* __restrict__ z,
                   int64_t z_ld, float* __restrict__ partial, int64_t m, int64_t r, int64_t n,
                   int64_t m_per_split) {
  using L = LeftLayout<kMt>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* shared = reinterpret_cast<T*>(shared_bytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wn = warp % 2, wk = warp / 2;
  const int64_t n0 = int64_t{blockIdx.x} * kTile;
  const int64_t m_begin = int64_t{blockIdx.y} * m_per_split;
  const int64_t m_end = Min64(m, m_begin + m_per_split);
  const int tiles = static_cast<int>((m_end - m_begin + kTile - 1) / kTile);

  auto load = [&](int tile, int stage) {
    T* ts = shared + stage * L::kStageElems;
    T* gs = ts + L::kTElems;
    const int64_t row0 = m_begin + int64_t{tile} * kTile;
    for (int c = threadIdx.x; c < kTile * 2 * kMt; c += kThreads) {
      const int row = c / (2 * kMt), col = (c % (2 * kMt)) * 8;
      const int bytes = row0 + row < m_end ? BytesBefore(col, r) : 0;
      CopyAsync16(ts + row * L::kTRow + col, bytes > 0 ? t + (row0 + row) * t_ld + col : t, bytes);
    }
    for (int c = threadIdx.x; c < kTile * 8; c += kThreads) {
      const int row = c / 8, col = (c % 8) * 8;
      const int bytes = row0 + row < m_end ? BytesBefore(n0 + col, n) : 0;
      CopyAsync16(gs + row * kRow + col, bytes > 0 ? g + (row0 + row) * g_ld + n0 + col : g, bytes);
    }
  };

  float acc[kMt][4][4] = {};
  Pipeline(tiles, load, [&](int stage) {
    const T* ts = shared + stage * L::kStageElems;
    const T* gs = ts + L::kTElems;
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const int kk = wk * 32 + ks * 16;
      uint32_t b[2][4];
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        LoadMatricesTransposed(b[p], gs + (kk + lane % 8 + ((lane / 8) % 2) * 8) * kRow + wn * 32 + p * 16 +
                                         (lane / 16) * 8);
      }
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        uint32_t a[4];
        LoadMatricesTransposed(a, ts + (kk + lane % 8 + (lane / 16) * 8) * L::kTRow + mt * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          Mma<T>(acc[mt][2 * p], a, b[p][0], b[p][1]);
          Mma<T>(acc[mt][2 * p + 1], a, b[p][2], b[p][3]);
        }
      }
    }
  });
  __syncthreads();  // every warp done with the stages: their memory holds the exchange now

  float* exchange = reinterpret_cast<float*>(shared_bytes) + wn * (kMt * 16 * 32);
  if (wk == 1) {
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
      for (int q = 0; q < 16; ++q) exchange[(mt * 16 + q) * 32 + lane] = acc[mt][q / 4][q % 4];
    }
  }
  __syncthreads();
  if (wk == 1) return;
  // Accumulator (mt, nt, i): row mt * 16 + lane / 4 (+ 8 for i >= 2) of z,
  // column wn * 32 + nt * 8 + 2 (lane % 4) + i % 2 of the block's 64.
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float sum = acc[mt][nt][i] + exchange[(mt * 16 + nt * 4 + i) * 32 + lane];
        const int64_t row = mt * 16 + lane / 4 + (i / 2) * 8;
        const int64_t col = n0 + wn * 32 + nt * 8 + 2 * (lane % 4) + i % 2;
        if (row >= r || col >= n) continue;
        if (partial != nullptr) {
          partial[(int64_t{blockIdx.y} * r + row) * n + col] = sum;
        } else {
          z[row * z_ld + col] = FromFloat<T>(sum);
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

// The current device's number of SMs (looked up once per device).
int SmCount() {
  static std::array<std::atomic<int>, 64> known{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) return 132;
  if (device >= static_cast<int>(known.size())) device = static_cast<int>(known.size()) - 1;
  int count = known[device].load();
  if (count == 0) {
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || count <= 0) {
      count = 132;
    }
    known[device].store(count);
  }
  return count;
}

// How a sum of `length` terms is split over blocks when the output gives
// `blocks` blocks: {splits, terms a split (a multiple of kTile)}. Enough
// blocks for about four per SM, each split at least 4 tiles long.
std::pair<int, int64_t> Splits(int64_t blocks, int64_t length) {
  const int64_t wanted = (4 * int64_t{SmCount()} + blocks - 1) / blocks;
  const int64_t most = std::max<int64_t>(1, (length + 4 * kTile - 1) / (4 * kTile));
  const int64_t splits = std::clamp<int64_t>(std::min(wanted, most), 1, kMaxThinSplits);
  const int64_t tiles = (length + kTile - 1) / kTile;
  const int64_t per_split = ((tiles + splits - 1) / splits) * kTile;
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
  const int64_t blocks = std::min<int64_t>((rows * cols + 255) / 256, 4 * int64_t{SmCount()});
  SumSplitsKernel<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(partial, splits, rows, cols,
                                                                         static_cast<T*>(out), out_ld);
  return LaunchError(what);
}

template <typename T, int kNp, bool kWRows>
std::string LaunchRight(const void* x, int64_t x_ld, const void* w, int64_t w_stride_r, int64_t w_stride_k, void* y,
                        int64_t y_ld, int64_t m, int64_t k, int64_t r, float* workspace, cudaStream_t stream) {
  using L = RightLayout<kNp, kWRows>;
  const int64_t row_blocks = (m + kTile - 1) / kTile;
  const auto [splits, per_split] = Splits(row_blocks, k);
  const auto kernel = ThinRightKernel<T, kNp, kWRows>;
  if (!AllowShared(kernel, L::kSharedBytes)) return LaunchError("ThinRightProduct");
  kernel<<<dim3(static_cast<unsigned>(row_blocks), static_cast<unsigned>(splits)), kThreads, L::kSharedBytes,
           stream>>>(static_cast<const T*>(x), x_ld, static_cast<const T*>(w), w_stride_r, w_stride_k,
                     static_cast<T*>(y), y_ld, splits > 1 ? workspace : nullptr, m, k, r, per_split);
  std::string error = LaunchError("ThinRightProduct");
  if (error.empty() && splits > 1) error = SumSplits<T>(workspace, splits, m, r, y, y_ld, stream, "ThinRightProduct");
  return error;
}

template <typename T, int kMt>
std::string LaunchLeft(const void* t, int64_t t_ld, const void* g, int64_t g_ld, void* z, int64_t z_ld, int64_t m,
                       int64_t r, int64_t n, float* workspace, cudaStream_t stream) {
  using L = LeftLayout<kMt>;
  const int64_t col_blocks = (n + kTile - 1) / kTile;
  const auto [splits, per_split] = Splits(col_blocks, m);
  const auto kernel = ThinLeftKernel<T, kMt>;
  if (!AllowShared(kernel, L::kSharedBytes)) return LaunchError("ThinLeftProduct");
  kernel<<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits)), kThreads, L::kSharedBytes,
           stream>>>(static_cast<const T*>(t), t_ld, static_cast<const T*>(g), g_ld, static_cast<T*>(z), z_ld,
                     splits > 1 ? workspace : nullptr, m, r, n, per_split);
  std::string error = LaunchError("ThinLeftProduct");
  if (error.empty() && splits > 1) error = SumSplits<T>(workspace, splits, r, n, z, z_ld, stream, "ThinLeftProduct");
  return error;
}

template <typename T, bool kWRows>
std::string DispatchRight(int np, const void* x, int64_t x_ld, const void* w, int64_t w_stride_r,
                          int64_t w_stride_k, void* y, int64_t y_ld, int64_t m, int64_t k, int64_t r,
                          float* workspace, cudaStream_t stream) {
  switch (np) {
    case 2:
      return LaunchRight<T, 2, kWRows>(x, x_ld, w, w_stride_r, w_stride_k, y, y_ld, m, k, r, workspace, stream);
    case 4:
      return LaunchRight<T, 4, kWRows>(x, x_ld, w, w_stride_r, w_stride_k, y, y_ld, m, k, r, workspace, stream);
    case 6:
      return LaunchRight<T, 6, kWRows>(x, x_ld, w, w_stride_r, w_stride_k, y, y_ld, m, k, r, workspace, stream);
    default:
      return LaunchRight<T, 8, kWRows>(x, x_ld, w, w_stride_r, w_stride_k, y, y_ld, m, k, r, workspace, stream);
  }
}

template <typename T>
std::string DispatchLeft(int mt, const void* t, int64_t t_ld, const void* g, int64_t g_ld, void* z, int64_t z_ld,
                         int64_t m, int64_t r, int64_t n, float* workspace, cudaStream_t stream) {
  switch (mt) {
    case 1:
      return LaunchLeft<T, 1>(t, t_ld, g, g_ld, z, z_ld, m, r, n, workspace, stream);
    case 2:
      return LaunchLeft<T, 2>(t, t_ld, g, g_ld, z, z_ld, m, r, n, workspace, stream);
    case 3:
      return LaunchLeft<T, 3>(t, t_ld, g, g_ld, z, z_ld, m, r, n, workspace, stream);
    default:
      return LaunchLeft<T, 4>(t, t_ld, g, g_ld, z, z_ld, m, r, n, workspace, stream);
  }
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
  if (m <= 0 || k <= 0 || r <= 0) return 0;
  const auto [splits, per_split] = Splits((m + kTile - 1) / kTile, k);
  (void)per_split;
  return splits > 1 ? static_cast<size_t>(splits) * m * r * sizeof(float) : 0;
}

size_t ThinLeftProductWorkspaceBytes(int64_t m, int64_t r, int64_t n) {
  if (m <= 0 || r <= 0 || n <= 0) return 0;
  const auto [splits, per_split] = Splits((n + kTile - 1) / kTile, m);
  (void)per_split;
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
  const int np = static_cast<int>(((r + 15) / 16) * 2);  // 8-column tiles, rounded up to even
  const cudaStream_t s = AsStream(stream);
  if (dtype == DType::kBFloat16) {
    return w_rows ? DispatchRight<__nv_bfloat16, true>(np, x, x_ld, w, w_stride_r, 1, y, y_ld, m, k, r, workspace, s)
                  : DispatchRight<__nv_bfloat16, false>(np, x, x_ld, w, 1, w_stride_k, y, y_ld, m, k, r, workspace,
                                                        s);
  }
  return w_rows ? DispatchRight<__half, true>(np, x, x_ld, w, w_stride_r, 1, y, y_ld, m, k, r, workspace, s)
                : DispatchRight<__half, false>(np, x, x_ld, w, 1, w_stride_k, y, y_ld, m, k, r, workspace, s);
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
  const int mt = static_cast<int>((r + 15) / 16);
  const cudaStream_t s = AsStream(stream);
  if (dtype == DType::kBFloat16) {
    return DispatchLeft<__nv_bfloat16>(mt, t, t_ld, g, g_ld, z, z_ld, m, r, n, workspace, s);
  }
  return DispatchLeft<__half>(mt, t, t_ld, g, g_ld, z, z_ld, m, r, n, workspace, s);
}

}  // namespace trainerd::kernels
