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
//
// LoraDropoutBackward is a module's whole backward through its mask in one
// pass: a tile of 4 rows by 8 columns a thread sums u a in registers (u's
// rows staged in shared memory as float32, a's 8 columns read as 16-byte
// vectors, L1 and L2 resident), then makes the tile's mask once for both the
// dropped input and the input gradient's term. The tile is small so that
// registers leave room for 16 warps an SM: the kernel issues integer (Philox),
// float and conversion work in about equal parts, and with fewer warps it
// waits on each of them in turn.

#include <algorithm>
#include <type_traits>

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

// a and b rounded to T, as float32: for 16-bit dtypes one paired conversion
// (F2FP, a full-rate pipe) instead of two single ones (F2F, quarter rate).
template <typename T>
__device__ __forceinline__ void RoundPair(float& a, float& b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(a, b);
    a = __low2float(p);
    b = __high2float(p);
  } else if constexpr (std::is_same_v<T, __half>) {
    const __half2 p = __floats2half2_rn(a, b);
    a = __low2float(p);
    b = __high2float(p);
  }
}

// Apply to two elements at once, its roundings paired (RoundPair): the same values.
template <typename T>
__device__ __forceinline__ void ApplyPair(const float (&x)[2], float (&y)[2], const bool (&keep)[2], float scale,
                                          bool accumulate) {
  float d0 = __fmul_rn(x[0], scale), d1 = __fmul_rn(x[1], scale);
  RoundPair<T>(d0, d1);
  if (!accumulate) {
    y[0] = keep[0] ? d0 : 0.f;
    y[1] = keep[1] ? d1 : 0.f;
    return;
  }
  float s0 = __fadd_rn(y[0], d0), s1 = __fadd_rn(y[1], d1);
  RoundPair<T>(s0, s1);
  y[0] = keep[0] ? s0 : y[0];
  y[1] = keep[1] ? s1 : y[1];
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
      for (int i = 0; i < kN; i += 2) {
        const bool keep[2] = {DropoutKeeps(DropoutDraw16(words, static_cast<int>(e0 & 7) + i), drop_below),
                              DropoutKeeps(DropoutDraw16(words, static_cast<int>(e0 & 7) + i + 1), drop_below)};
        const float pair_in[2] = {in[i], in[i + 1]};
        float pair_out[2] = {accumulate ? out[i] : 0.f, accumulate ? out[i + 1] : 0.f};
        ApplyPair<T>(pair_in, pair_out, keep, scale, accumulate);
        out[i] = pair_out[0], out[i + 1] = pair_out[1];
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

// ---- A module's backward -----------------------------------------------------

constexpr int kBackwardThreads = 128;
constexpr int kTileRows = 4;       // rows of a tile: its u a sums held in registers
constexpr int kTileCols = 8;       // columns a thread: one group of eight, one Philox call a row
constexpr int kTilesPerBlock = 8;  // tiles of a block's rows: u staged once for them, a's columns reread from L1
constexpr int kBlockRows = kTileRows * kTilesPerBlock;
constexpr int kMaxRank = 256;  // u's rows in shared memory: rank x kBlockRows float32, at most 32 KB

// 16-byte vectors in a thread's eight columns: one for a 16-bit dtype, two for float32.
template <typename T>
constexpr int kVecsPerEight = kTileCols / kVecElems<T>;

// Eight consecutive elements at p (16-byte aligned) as raw vectors, loaded
// through the read-only path, or coherently through L2 for a buffer the
// kernel also writes (acc).
template <typename T, bool kCoherent = false>
__device__ __forceinline__ void LoadEightRaw(const T* p, uint4 (&raw)[kVecsPerEight<T>]) {
#pragma unroll
  for (int h = 0; h < kVecsPerEight<T>; ++h) {
    const T* q = p + h * kVecElems<T>;
    raw[h] = kCoherent ? __ldcg(reinterpret_cast<const uint4*>(q)) : LoadVec(q);
  }
}

// The eight elements as float32, and back (rounded to T) into 16-byte stores.
template <typename T>
__device__ __forceinline__ void UnpackEight(const uint4 (&raw)[kVecsPerEight<T>], float (&f)[kTileCols]) {
  constexpr int kN = kVecElems<T>;
#pragma unroll
  for (int h = 0; h < kVecsPerEight<T>; ++h) {
    float part[kN];
    UnpackFloats<T>(raw[h], part);
#pragma unroll
    for (int i = 0; i < kN; ++i) f[h * kN + i] = part[i];
  }
}

template <typename T>
__device__ __forceinline__ void StoreEight(T* p, const float (&f)[kTileCols]) {
  constexpr int kN = kVecElems<T>;
#pragma unroll
  for (int h = 0; h < kVecsPerEight<T>; ++h) {
    float part[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) part[i] = f[h * kN + i];
    StoreVec(p + h * kN, PackFloats<T>(part));
  }
}

// A block: kBlockRows rows by kBackwardThreads * kTileCols columns, as
// kTilesPerBlock tiles of kTileRows rows. Per tile a thread first issues the
// loads of its x and acc vectors (their latency hidden behind the sums; 16-bit
// dtypes), then sums u a for its 4 x 8 elements (rank steps of 32 FMAs, a's 8
// columns one 16-byte load a step, u's 4 values one shared 16-byte load), then
// makes each row's mask once for both outputs.
// cols, every row stride and a's a multiple of 8; pointers 16-byte aligned;
// 0 < rank <= kMaxRank; dynamic shared memory rank * kBlockRows floats.
template <typename T>
__global__ void __launch_bounds__(kBackwardThreads)
    LoraDropoutBackwardKernel(const T* __restrict__ x, int64_t x_stride, T* __restrict__ dropped,
                              int64_t dropped_stride, const T* __restrict__ u, int64_t u_stride,
                              const T* __restrict__ a, int64_t a_stride, int rank, T* __restrict__ acc,
                              int64_t acc_stride, int64_t rows, int64_t cols, PhiloxState philox, uint64_t mask_index,
                              uint32_t drop_below, float scale) {
  extern __shared__ float4 u_rows4[];  // [rank][kBlockRows] float32: the block's rows of u, k-major
  float* u_rows = reinterpret_cast<float*>(u_rows4);
  constexpr int kV = kVecsPerEight<T>;
  const uint64_t seed = Seed(philox), mask = MaskNumber(philox, mask_index);
  const int64_t c0 = (int64_t{blockIdx.x} * kBackwardThreads + threadIdx.x) * kTileCols;
  for (int64_t rb = int64_t{blockIdx.y} * kBlockRows; rb < rows; rb += int64_t{gridDim.y} * kBlockRows) {
    __syncthreads();  // the rows before have been read
    for (int i = threadIdx.x; i < rank * kBlockRows; i += kBackwardThreads) {
      const int k = i / kBlockRows, row = i - k * kBlockRows;
      u_rows[i] = rb + row < rows ? ToFloat<T>(u[(rb + row) * u_stride + k]) : 0.f;
    }
    __syncthreads();
    if (c0 >= cols) continue;
#pragma unroll 1
    for (int t = 0; t < kTilesPerBlock; ++t) {
      const int64_t r0 = rb + t * kTileRows;
      if (r0 >= rows) break;
      const int64_t tile = rows - r0 < kTileRows ? rows - r0 : kTileRows;
      // 16-bit dtypes: the tile's x and acc vectors loaded before the sums
      // (32 registers); float32 loads them row by row after (loaded before,
      // its twice as many vectors take the kernel from 80 registers to 143).
      constexpr bool kEarly = sizeof(T) == 2;
      uint4 x_raw[kEarly ? kTileRows : 1][kV], acc_raw[kEarly ? kTileRows : 1][kV];
      if constexpr (kEarly) {
#pragma unroll
        for (int row = 0; row < kTileRows; ++row) {
          if (row < tile) {
            LoadEightRaw<T>(x + (r0 + row) * x_stride + c0, x_raw[row]);
            LoadEightRaw<T, true>(acc + (r0 + row) * acc_stride + c0, acc_raw[row]);
          }
        }
      }
      float sum[kTileRows][kTileCols];
#pragma unroll
      for (int row = 0; row < kTileRows; ++row) {
#pragma unroll
        for (int j = 0; j < kTileCols; ++j) sum[row][j] = 0.f;
      }
      static_assert(kTileRows % 4 == 0, "a tile's u values of one step are whole float4s");
      const float4* u_tile = u_rows4 + t * (kTileRows / 4);  // row tile t's values of step k
#pragma unroll 4
      for (int k = 0; k < rank; ++k) {
        uint4 a_raw[kV];
        LoadEightRaw<T>(a + int64_t{k} * a_stride + c0, a_raw);
        float av[kTileCols];
        UnpackEight<T>(a_raw, av);
        float uk[kTileRows];
#pragma unroll
        for (int q = 0; q < kTileRows / 4; ++q) {
          const float4 v = u_tile[k * (kBlockRows / 4) + q];
          uk[4 * q] = v.x, uk[4 * q + 1] = v.y, uk[4 * q + 2] = v.z, uk[4 * q + 3] = v.w;
        }
#pragma unroll
        for (int row = 0; row < kTileRows; ++row) {
#pragma unroll
          for (int j = 0; j < kTileCols; ++j) sum[row][j] = fmaf(uk[row], av[j], sum[row][j]);
        }
      }
#pragma unroll
      for (int row = 0; row < kTileRows; ++row) {
        if (row < tile) {
          const int64_t r = r0 + row;
          const int slot = kEarly ? row : 0;
          if constexpr (!kEarly) {
            LoadEightRaw<T>(x + r * x_stride + c0, x_raw[0]);
            LoadEightRaw<T, true>(acc + r * acc_stride + c0, acc_raw[0]);
          }
          float xv[kTileCols], g[kTileCols], out[kTileCols];
          UnpackEight<T>(x_raw[slot], xv);
          UnpackEight<T>(acc_raw[slot], g);
          const Philox4 words = DropoutWords(seed, mask, static_cast<uint64_t>(r * cols + c0) >> 3);
          // x dropped; the term as the thin product's GEMM would have written it (rounded to T), dropped and
          // added to g; two columns at a time.
#pragma unroll
          for (int j = 0; j < kTileCols; j += 2) {
            const bool keep[2] = {DropoutKeeps(DropoutDraw16(words, j), drop_below),
                                  DropoutKeeps(DropoutDraw16(words, j + 1), drop_below)};
            const float pair_x[2] = {xv[j], xv[j + 1]};
            float pair_out[2] = {0.f, 0.f};
            ApplyPair<T>(pair_x, pair_out, keep, scale, /*accumulate=*/false);
            out[j] = pair_out[0], out[j + 1] = pair_out[1];
            float term[2] = {sum[row][j], sum[row][j + 1]};
            RoundPair<T>(term[0], term[1]);
            float pair_g[2] = {g[j], g[j + 1]};
            ApplyPair<T>(term, pair_g, keep, scale, /*accumulate=*/true);
            g[j] = pair_g[0], g[j + 1] = pair_g[1];
          }
          StoreEight<T>(dropped + r * dropped_stride + c0, out);
          StoreEight<T>(acc + r * acc_stride + c0, g);
        }
      }
    }
  }
}

}  // namespace

std::string LoraDropoutBackward(const void* x, int64_t x_stride, void* dropped, int64_t dropped_stride, const void* u,
                                int64_t u_stride, const void* a, int64_t a_stride, int64_t rank, void* acc,
                                int64_t acc_stride, int64_t rows, int64_t cols, const PhiloxState& philox,
                                uint64_t mask_index, uint32_t drop_below, float scale, DType dtype, void* stream) {
  if (rows < 0 || cols < 0) return "LoraDropoutBackward: negative sizes";
  if (rows == 0 || cols == 0) return {};
  if (!LoraDropoutBackwardFits(x, x_stride, dropped, dropped_stride, u, u_stride, a, a_stride, rank, acc, acc_stride,
                               cols)) {
    return "LoraDropoutBackward: a layout the kernel does not take (LoraDropoutBackwardFits)";
  }
  const cudaStream_t s = AsStream(stream);
  return DispatchDType(dtype, [&](auto tag) -> std::string {
    using T = decltype(tag);
    const dim3 grid(static_cast<unsigned>((cols / kTileCols + kBackwardThreads - 1) / kBackwardThreads),
                    static_cast<unsigned>(std::min<int64_t>((rows + kBlockRows - 1) / kBlockRows, 65535)));
    const size_t shared = static_cast<size_t>(rank) * kBlockRows * sizeof(float);
    LoraDropoutBackwardKernel<T><<<grid, kBackwardThreads, shared, s>>>(
        static_cast<const T*>(x), x_stride, static_cast<T*>(dropped), dropped_stride, static_cast<const T*>(u),
        u_stride, static_cast<const T*>(a), a_stride, static_cast<int>(rank), static_cast<T*>(acc), acc_stride, rows,
        cols, philox, mask_index, drop_below, scale);
    return LaunchError("LoraDropoutBackward");
  });
}

bool LoraDropoutBackwardFits(const void* x, int64_t x_stride, const void* dropped, int64_t dropped_stride,
                             const void* u, int64_t u_stride, const void* a, int64_t a_stride, int64_t rank,
                             const void* acc, int64_t acc_stride, int64_t cols) {
  const bool strides = x_stride % kTileCols == 0 && dropped_stride % kTileCols == 0 && a_stride % kTileCols == 0 &&
                       acc_stride % kTileCols == 0 && x_stride >= cols && dropped_stride >= cols &&
                       a_stride >= cols && acc_stride >= cols && u_stride >= rank;
  return x && dropped && u && a && acc && cols % kTileCols == 0 && rank > 0 && rank <= kMaxRank && strides &&
         Aligned16(x) && Aligned16(dropped) && Aligned16(a) && Aligned16(acc);
}

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
