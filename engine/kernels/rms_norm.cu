// RMSNorm forward and backward (contracts in fused_kernels.h).
//
// Layout: one block per row (grid-strided when rows exceed the grid). The
// vector path keeps the row's 16-byte vectors in registers between the
// reduction and the write, so x (and dy) are read from memory once: a
// thread holds kVecs vectors (1, 2 or 4, compile-time, so the arrays stay in
// registers), blocks have at most 512 threads, which covers rows of up to
// 2048 vectors (16384 bf16/fp16 values, 8192 float32). Other rows (odd
// lengths, unaligned pointers, longer rows) take the scalar path, which reads
// the row twice (the second time mostly from L1/L2).
//
// Reductions are warp shuffles then one shared-memory step, in a fixed order,
// so results do not vary between runs.
#include <algorithm>
#include <climits>
#include <utility>

#include "engine/kernels/dtype_access.cuh"

namespace trainerd::kernels {
namespace {

// The shared device helpers (dtype_access.cuh).
using namespace detail;  // NOLINT(build/namespaces)

constexpr int kMaxVecThreads = 512;  // vector-path blocks: up to 128 registers a thread
constexpr int kMinVecThreads = 128;  // below this a row's block has too few warps to hide its reduction
constexpr int kScalarThreads = 512;
// Blocks of the backward grid when dweight is computed: each block sums its
// rows' dweight contributions into one partial row (fixed, device-independent,
// so the summation order, hence the bits, are the same on every GPU).
constexpr int64_t kMaxWeightGradBlocks = 512;

// Sum of v over the block, returned to every thread. blockDim.x must be a
// multiple of 32 (every lane takes part in the shuffles). `shared`: 32 floats.
__device__ __forceinline__ float BlockSum(float v, float* shared) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // the previous call's readers are done with `shared`
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float t = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

// ---- forward ----

// delta, sum: both null (RMSNorm of x), or the residual sum's operands:
// x's row is replaced by T(x + delta), which is written to sum (dense).
template <typename T, int kVecs>
__global__ void __launch_bounds__(kMaxVecThreads)
    RmsNormForwardVec(const T* __restrict__ x, const T* __restrict__ delta, T* __restrict__ sum,
                      const T* __restrict__ w, T* __restrict__ y, int64_t y_stride, float* __restrict__ rstd,
                      int64_t rows, int hidden, float eps) {
  constexpr int kN = kVecElems<T>;
  __shared__ float shared[32];
  const int nvec = hidden / kN;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const uint4* xr = reinterpret_cast<const uint4*>(x + row * hidden);
    uint4 xv[kVecs], dv[kVecs];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int v = threadIdx.x + k * blockDim.x;
      if (v < nvec) {
        xv[k] = LoadVec(xr + v);
        if (delta) dv[k] = LoadVec(delta + row * hidden + v * kN);
      }
    }
    if (delta) {
      uint4* sr = reinterpret_cast<uint4*>(sum + row * hidden);
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int v = threadIdx.x + k * blockDim.x;
        if (v < nvec) {
          float f[kN], d[kN];
          UnpackFloats<T>(xv[k], f);
          UnpackFloats<T>(dv[k], d);
#pragma unroll
          for (int i = 0; i < kN; ++i) f[i] += d[i];
          xv[k] = PackFloats<T>(f);
          StoreVec(sr + v, xv[k]);
        }
      }
    }
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (threadIdx.x + k * blockDim.x < nvec) {
        float f[kN];
        UnpackFloats<T>(xv[k], f);
#pragma unroll
        for (int i = 0; i < kN; ++i) ss += f[i] * f[i];
      }
    }
    const float r = rsqrtf(BlockSum(ss, shared) / static_cast<float>(hidden) + eps);
    T* yr = y + row * y_stride;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int v = threadIdx.x + k * blockDim.x;
      if (v < nvec) {
        float f[kN], wf[kN];
        UnpackFloats<T>(xv[k], f);
        LoadFloats<T, kN>(w + v * kN, wf);
#pragma unroll
        for (int i = 0; i < kN; ++i) f[i] = RoundTo<T>(f[i] * r) * wf[i];
        StoreFloats<T, kN>(yr + v * kN, f);
      }
    }
    if (threadIdx.x == 0) rstd[row] = r;
  }
}

// delta, sum: as for RmsNormForwardVec; the sum is written in the first
// pass and read back (its own writes: visible to the thread) in the second.
template <typename T>
__global__ void __launch_bounds__(kScalarThreads)
    RmsNormForwardScalar(const T* __restrict__ x, const T* __restrict__ delta, T* __restrict__ sum,
                         const T* __restrict__ w, T* __restrict__ y, int64_t y_stride, float* __restrict__ rstd,
                         int64_t rows, int hidden, float eps) {
  __shared__ float shared[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = delta ? sum + row * hidden : x + row * hidden;
    float ss = 0.f;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
      float f = detail::ToFloat<T>(x[row * hidden + j]);
      if (delta) {
        const T s = detail::FromFloat<T>(f + detail::ToFloat<T>(delta[row * hidden + j]));
        sum[row * hidden + j] = s;
        f = detail::ToFloat<T>(s);
      }
      ss += f * f;
    }
    const float r = rsqrtf(BlockSum(ss, shared) / static_cast<float>(hidden) + eps);
    T* yr = y + row * y_stride;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
      yr[j] = detail::FromFloat<T>(RoundTo<T>(detail::ToFloat<T>(xr[j]) * r) * detail::ToFloat<T>(w[j]));
    }
    if (threadIdx.x == 0) rstd[row] = r;
  }
}

// ---- backward ----

// partial: (gridDim.x, hidden) float32, written only when kWeightGrad.
template <typename T, int kVecs, bool kWeightGrad>
__global__ void __launch_bounds__(kMaxVecThreads)
    RmsNormBackwardVec(const T* __restrict__ dy, int64_t dy_stride, const T* __restrict__ dsum, int64_t dsum_stride,
                       const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ rstd,
                       T* __restrict__ dx, int64_t dx_stride, float* __restrict__ partial, int64_t rows, int hidden) {
  constexpr int kN = kVecElems<T>;
  __shared__ float shared[32];
  const int nvec = hidden / kN;
  const float inv_hidden = 1.f / static_cast<float>(hidden);
  // The weight is read where it is used (from L1 or L2: every row reads the
  // same), not held in registers: the 16 a thread it would hold cost a block
  // per SM, and blocks (rows) in flight are what this bandwidth-bound kernel
  // runs on.
  float acc[kWeightGrad ? kVecs * kN : 1];  // this thread's columns of dweight
#pragma unroll
  for (int i = 0; i < (kWeightGrad ? kVecs * kN : 1); ++i) acc[i] = 0.f;

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const uint4* xr = reinterpret_cast<const uint4*>(x + row * hidden);
    const uint4* dr = reinterpret_cast<const uint4*>(dy + row * dy_stride);
    uint4 xv[kVecs], dv[kVecs], sv[kVecs];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int v = threadIdx.x + k * blockDim.x;
      if (v < nvec) {
        xv[k] = LoadVec(xr + v);
        dv[k] = LoadVec(dr + v);
        if (dsum) sv[k] = LoadVec(dsum + row * dsum_stride + v * kN);
      }
    }
    const float r = rstd[row];
    float dot = 0.f;  // sum_i g_i x_i, g = dy * w
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int v = threadIdx.x + k * blockDim.x;
      if (v < nvec) {
        float xf[kN], df[kN], wf[kN];
        UnpackFloats<T>(xv[k], xf);
        UnpackFloats<T>(dv[k], df);
        UnpackFloats<T>(LoadVec(w + v * kN), wf);
#pragma unroll
        for (int i = 0; i < kN; ++i) dot += df[i] * wf[i] * xf[i];
      }
    }
    const float coef = r * r * r * BlockSum(dot, shared) * inv_hidden;
    T* dxr = dx + row * dx_stride;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int v = threadIdx.x + k * blockDim.x;
      if (v < nvec) {
        float xf[kN], df[kN], wf[kN], out[kN];
        UnpackFloats<T>(xv[k], xf);
        UnpackFloats<T>(dv[k], df);
        UnpackFloats<T>(LoadVec(w + v * kN), wf);
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          out[i] = r * df[i] * wf[i] - coef * xf[i];
          if constexpr (kWeightGrad) acc[k * kN + i] += df[i] * RoundTo<T>(xf[i] * r);
        }
        if (dsum) {  // the norm's gradient rounded, then the sum's added: autograd's two steps
          float sf[kN];
          UnpackFloats<T>(sv[k], sf);
#pragma unroll
          for (int i = 0; i < kN; ++i) out[i] = RoundTo<T>(out[i]) + sf[i];
        }
        StoreFloats<T, kN>(dxr + v * kN, out);
      }
    }
  }
  if constexpr (kWeightGrad) {
    float* pr = partial + static_cast<int64_t>(blockIdx.x) * hidden;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int v = threadIdx.x + k * blockDim.x;
      if (v < nvec) {
        float4* p = reinterpret_cast<float4*>(pr + v * kN);  // kN is 4 or 8: whole float4s
#pragma unroll
        for (int q = 0; q < kN / 4; ++q) {
          p[q] = make_float4(acc[k * kN + 4 * q], acc[k * kN + 4 * q + 1], acc[k * kN + 4 * q + 2],
                             acc[k * kN + 4 * q + 3]);
        }
      }
    }
  }
}

template <typename T, bool kWeightGrad>
__global__ void __launch_bounds__(kScalarThreads)
    RmsNormBackwardScalar(const T* __restrict__ dy, int64_t dy_stride, const T* __restrict__ dsum,
                          int64_t dsum_stride, const T* __restrict__ x, const T* __restrict__ w,
                          const float* __restrict__ rstd, T* __restrict__ dx, int64_t dx_stride,
                          float* __restrict__ partial, int64_t rows, int hidden) {
  using detail::FromFloat;
  using detail::ToFloat;
  __shared__ float shared[32];
  const float inv_hidden = 1.f / static_cast<float>(hidden);
  // Thread t owns columns j = t (mod blockDim.x) of the block's partial row:
  // it alone reads and writes them, so no barrier is needed around them.
  float* pr = kWeightGrad ? partial + static_cast<int64_t>(blockIdx.x) * hidden : nullptr;
  if constexpr (kWeightGrad) {
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) pr[j] = 0.f;
  }
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * hidden;
    const T* dr = dy + row * dy_stride;
    const float r = rstd[row];
    float dot = 0.f;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
      dot += ToFloat<T>(dr[j]) * ToFloat<T>(w[j]) * ToFloat<T>(xr[j]);
    }
    const float coef = r * r * r * BlockSum(dot, shared) * inv_hidden;
    T* dxr = dx + row * dx_stride;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
      const float xf = ToFloat<T>(xr[j]), df = ToFloat<T>(dr[j]);
      float out = r * df * ToFloat<T>(w[j]) - coef * xf;
      if (dsum) out = RoundTo<T>(out) + ToFloat<T>(dsum[row * dsum_stride + j]);
      dxr[j] = FromFloat<T>(out);
      if constexpr (kWeightGrad) pr[j] += df * RoundTo<T>(xf * r);
    }
  }
}

// dweight[j] = sum over b of partial[b][j], b in increasing order within each
// of 8 strided lanes, then the 8 lane sums in order: a fixed summation order.
// Block (32, 8): 32 columns, 8 lanes over the partial rows.
__global__ void __launch_bounds__(256)
    SumPartialRows(const float* __restrict__ partial, int blocks, int hidden, float* __restrict__ dweight) {
  __shared__ float lane_sum[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float s = 0.f;
  if (col < hidden) {
#pragma unroll 8
    for (int b = threadIdx.y; b < blocks; b += 8) s += partial[static_cast<int64_t>(b) * hidden + col];
  }
  lane_sum[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < hidden) {
    float t = 0.f;
#pragma unroll
    for (int l = 0; l < 8; ++l) t += lane_sum[l][threadIdx.x];
    dweight[col] = t;
  }
}

// How a row is split over a block: vecs_per_thread 16-byte vectors a thread
// (1, 2 or 4), or 0 for the scalar path.
struct RowPlan {
  int vecs_per_thread = 0;
  int threads = 0;
};

int64_t RoundUp32(int64_t n) { return (n + 31) / 32 * 32; }

// The most vectors a thread (so the most loads in flight before the row's
// reduction waits on them) that leaves at least kMinVecThreads threads a row;
// failing that, the fewest that fit the block.
RowPlan PlanRow(int64_t hidden, int vec_elems, bool aligned) {
  if (aligned && hidden % vec_elems == 0) {
    const int64_t nvec = hidden / vec_elems;
    for (int k : {4, 2, 1}) {
      const int64_t threads = RoundUp32((nvec + k - 1) / k);
      if (threads >= kMinVecThreads && threads <= kMaxVecThreads) return {k, static_cast<int>(threads)};
    }
    for (int k : {1, 2, 4}) {
      const int64_t threads = RoundUp32((nvec + k - 1) / k);
      if (threads <= kMaxVecThreads) return {k, static_cast<int>(threads)};
    }
  }
  return {0, static_cast<int>(std::min<int64_t>(kScalarThreads, RoundUp32(hidden)))};
}

unsigned GridFor(int64_t blocks) { return static_cast<unsigned>(std::min<int64_t>(blocks, INT_MAX)); }

int64_t WeightGradBlocks(int64_t rows) { return std::min(rows, kMaxWeightGradBlocks); }

std::string CheckSizes(const char* what, int64_t rows, int64_t hidden) {
  if (rows < 0 || hidden <= 0 || hidden > INT_MAX / 2) {
    return std::string(what) + ": bad sizes rows=" + std::to_string(rows) + " hidden=" + std::to_string(hidden);
  }
  return {};
}

template <typename T, bool kWeightGrad>
void LaunchBackward(const RowPlan& p, unsigned grid, cudaStream_t s, const T* dy, int64_t dy_stride, const T* dsum,
                    int64_t dsum_stride, const T* x, const T* w, const float* rstd, T* dx, int64_t dx_stride,
                    float* partial, int64_t rows, int hidden) {
  switch (p.vecs_per_thread) {
    case 1:
      RmsNormBackwardVec<T, 1, kWeightGrad><<<grid, p.threads, 0, s>>>(dy, dy_stride, dsum, dsum_stride, x, w,
                                                                      rstd, dx, dx_stride, partial, rows, hidden);
      break;
    case 2:
      RmsNormBackwardVec<T, 2, kWeightGrad><<<grid, p.threads, 0, s>>>(dy, dy_stride, dsum, dsum_stride, x, w,
                                                                      rstd, dx, dx_stride, partial, rows, hidden);
      break;
    case 4:
      RmsNormBackwardVec<T, 4, kWeightGrad><<<grid, p.threads, 0, s>>>(dy, dy_stride, dsum, dsum_stride, x, w,
                                                                      rstd, dx, dx_stride, partial, rows, hidden);
      break;
    default:
      RmsNormBackwardScalar<T, kWeightGrad><<<grid, p.threads, 0, s>>>(dy, dy_stride, dsum, dsum_stride, x, w,
                                                                       rstd, dx, dx_stride, partial, rows, hidden);
  }
}

// RmsNormForward and AddRmsNormForward (delta and sum null for the former).
std::string Forward(const char* what, const void* x, const void* delta, void* sum, const void* weight, void* y,
                    int64_t y_stride, float* rstd, int64_t rows, int64_t hidden, float eps, DType dtype,
                    void* stream) {
  if (std::string e = CheckSizes(what, rows, hidden); !e.empty()) return e;
  if (y_stride < hidden) return std::string(what) + ": y_stride " + std::to_string(y_stride) + " < hidden";
  if (rows == 0) return {};
  if (!x || !weight || !y || !rstd) return std::string(what) + ": a null pointer";
  return DispatchDType(dtype, [&](auto tag) -> std::string {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x);
    const T* dp = static_cast<const T*>(delta);
    T* sp = static_cast<T*>(sum);
    const T* wp = static_cast<const T*>(weight);
    T* yp = static_cast<T*>(y);
    const int h = static_cast<int>(hidden);
    const bool aligned = Aligned16(x) && Aligned16(weight) && Aligned16(y) && y_stride % kVecElems<T> == 0 &&
                         (!delta || (Aligned16(delta) && Aligned16(sum)));
    const RowPlan p = PlanRow(hidden, kVecElems<T>, aligned);
    const unsigned grid = GridFor(rows);
    const cudaStream_t s = AsStream(stream);
    switch (p.vecs_per_thread) {
      case 1:
        RmsNormForwardVec<T, 1><<<grid, p.threads, 0, s>>>(xp, dp, sp, wp, yp, y_stride, rstd, rows, h, eps);
        break;
      case 2:
        RmsNormForwardVec<T, 2><<<grid, p.threads, 0, s>>>(xp, dp, sp, wp, yp, y_stride, rstd, rows, h, eps);
        break;
      case 4:
        RmsNormForwardVec<T, 4><<<grid, p.threads, 0, s>>>(xp, dp, sp, wp, yp, y_stride, rstd, rows, h, eps);
        break;
      default:
        RmsNormForwardScalar<T><<<grid, p.threads, 0, s>>>(xp, dp, sp, wp, yp, y_stride, rstd, rows, h, eps);
    }
    return LaunchError(what);
  });
}

// RmsNormBackward and AddRmsNormBackward (dsum null for the former).
std::string Backward(const char* what, const void* dy, int64_t dy_stride, const void* dsum, int64_t dsum_stride,
                     const void* x, const void* weight, const float* rstd, void* dx, int64_t dx_stride,
                     float* dweight, void* workspace, size_t workspace_bytes, int64_t rows, int64_t hidden,
                     DType dtype, void* stream) {
  if (std::string e = CheckSizes(what, rows, hidden); !e.empty()) return e;
  for (const auto& [name, stride] : {std::pair<const char*, int64_t>{"dy_stride", dy_stride},
                                     {"dsum_stride", dsum_stride}, {"dx_stride", dx_stride}}) {
    if (stride < hidden) return std::string(what) + ": " + name + " " + std::to_string(stride) + " < hidden";
  }
  const cudaStream_t s = AsStream(stream);
  if (rows == 0) {
    if (dweight && cudaMemsetAsync(dweight, 0, hidden * sizeof(float), s) != cudaSuccess) {
      return LaunchError((std::string(what) + " (zeroing dweight)").c_str());
    }
    return {};
  }
  if (!dy || !x || !weight || !rstd || !dx) return std::string(what) + ": a null pointer";
  const size_t needed = RmsNormBackwardWorkspaceBytes(rows, hidden);
  if (dweight && (!workspace || workspace_bytes < needed || !Aligned16(workspace))) {
    return std::string(what) + ": dweight needs a 16-byte aligned workspace of " + std::to_string(needed) +
           " bytes, got " + std::to_string(workspace_bytes);
  }
  return DispatchDType(dtype, [&](auto tag) -> std::string {
    using T = decltype(tag);
    const T* dyp = static_cast<const T*>(dy);
    const T* dsp = static_cast<const T*>(dsum);
    const T* xp = static_cast<const T*>(x);
    const T* wp = static_cast<const T*>(weight);
    T* dxp = static_cast<T*>(dx);
    const int h = static_cast<int>(hidden);
    const RowPlan p = PlanRow(hidden, kVecElems<T>,
                              Aligned16(dy) && dy_stride % kVecElems<T> == 0 && Aligned16(x) && Aligned16(weight) &&
                                  Aligned16(dx) && dx_stride % kVecElems<T> == 0 &&
                                  (!dsum || (Aligned16(dsum) && dsum_stride % kVecElems<T> == 0)));
    if (!dweight) {
      LaunchBackward<T, false>(p, GridFor(rows), s, dyp, dy_stride, dsp, dsum_stride, xp, wp, rstd, dxp, dx_stride,
                               nullptr, rows, h);
      return LaunchError(what);
    }
    const int blocks = static_cast<int>(WeightGradBlocks(rows));
    float* partial = static_cast<float*>(workspace);
    LaunchBackward<T, true>(p, blocks, s, dyp, dy_stride, dsp, dsum_stride, xp, wp, rstd, dxp, dx_stride, partial,
                            rows, h);
    if (std::string e = LaunchError(what); !e.empty()) return e;
    SumPartialRows<<<GridFor((hidden + 31) / 32), dim3(32, 8), 0, s>>>(partial, blocks, h, dweight);
    return LaunchError((std::string(what) + " (dweight sum)").c_str());
  });
}

}  // namespace

std::string RmsNormForward(const void* x, const void* weight, void* y, int64_t y_stride, float* rstd, int64_t rows,
                           int64_t hidden, float eps, DType dtype, void* stream) {
  return Forward("RmsNormForward", x, nullptr, nullptr, weight, y, y_stride, rstd, rows, hidden, eps, dtype, stream);
}

std::string AddRmsNormForward(const void* residual, const void* delta, void* sum, const void* weight, void* y,
                              int64_t y_stride, float* rstd, int64_t rows, int64_t hidden, float eps, DType dtype,
                              void* stream) {
  if (rows > 0 && (!delta || !sum)) return "AddRmsNormForward: a null pointer";
  return Forward("AddRmsNormForward", residual, delta, sum, weight, y, y_stride, rstd, rows, hidden, eps, dtype,
                 stream);
}

size_t RmsNormBackwardWorkspaceBytes(int64_t rows, int64_t hidden) {
  if (rows <= 0 || hidden <= 0) return 0;
  return static_cast<size_t>(WeightGradBlocks(rows)) * static_cast<size_t>(hidden) * sizeof(float);
}

std::string RmsNormBackward(const void* dy, int64_t dy_stride, const void* x, const void* weight, const float* rstd,
                            void* dx, int64_t dx_stride, float* dweight, void* workspace, size_t workspace_bytes,
                            int64_t rows, int64_t hidden, DType dtype, void* stream) {
  return Backward("RmsNormBackward", dy, dy_stride, nullptr, hidden, x, weight, rstd, dx, dx_stride, dweight,
                  workspace, workspace_bytes, rows, hidden, dtype, stream);
}

std::string AddRmsNormBackward(const void* dy, int64_t dy_stride, const void* dsum, int64_t dsum_stride,
                               const void* sum, const void* weight, const float* rstd, void* dx, int64_t dx_stride,
                               float* dweight, void* workspace, size_t workspace_bytes, int64_t rows, int64_t hidden,
                               DType dtype, void* stream) {
  if (rows > 0 && !dsum) return "AddRmsNormBackward: a null pointer";
  return Backward("AddRmsNormBackward", dy, dy_stride, dsum, dsum_stride, sum, weight, rstd, dx, dx_stride, dweight,
                  workspace, workspace_bytes, rows, hidden, dtype, stream);
}

}  // namespace trainerd::kernels
