// LoRA dropout over (rows, cols) matrices with masks made from Philox
// (contract in fused_kernels.h, the keep rule in philox.h).
//
// A thread takes a group of four consecutive elements of the row-major order,
// the four that one Philox call decides: one vector access of 4 elements where
// the columns are a multiple of 4 and the rows and pointers aligned to it,
// else each element on its own (a group may span two rows). The seed and
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

// Four elements of T in one access: 8 bytes for 16-bit dtypes, 16 for float32.
template <typename T>
struct alignas(4 * sizeof(T)) Quad {
  T e[4];
};

template <typename T>
__device__ __forceinline__ float Dropped(T x, bool keep, float scale) {
  // __fmul_rn: the product rounded on its own, never fused into an add.
  return keep ? RoundTo<T>(__fmul_rn(ToFloat<T>(x), scale)) : 0.f;
}

template <typename T, bool kVector>
__global__ void __launch_bounds__(kThreads)
    DropoutRowsKernel(const T* x, int64_t x_stride, T* y, int64_t y_stride, int64_t rows, int64_t cols,
                      PhiloxState philox, uint64_t mask_index, uint32_t drop_below, float scale, bool accumulate) {
  const uint64_t seed = philox.seed_ptr ? static_cast<uint64_t>(*philox.seed_ptr) : philox.seed;
  const uint64_t offset =
      philox.offset_ptr ? static_cast<uint64_t>(*philox.offset_ptr) + philox.offset_intragraph : philox.offset;
  const uint64_t mask = offset + mask_index;
  const int64_t total = rows * cols;
  const int64_t groups = (total + 3) / 4;
  for (int64_t q = blockIdx.x * int64_t{kThreads} + threadIdx.x; q < groups; q += int64_t{gridDim.x} * kThreads) {
    const Philox4 words = DropoutWords(seed, mask, static_cast<uint64_t>(q));
    if constexpr (kVector) {
      // cols % 4 == 0: the group lies in one row.
      const int64_t r = (4 * q) / cols, c = 4 * q - r * cols;
      const Quad<T> in = *reinterpret_cast<const Quad<T>*>(x + r * x_stride + c);
      Quad<T>* out_p = reinterpret_cast<Quad<T>*>(y + r * y_stride + c);
      Quad<T> out = accumulate ? *out_p : Quad<T>{};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool keep = DropoutKeeps(words.v[j], drop_below);
        const float d = Dropped(in.e[j], keep, scale);
        if (!accumulate) {
          out.e[j] = FromFloat<T>(d);
        } else if (keep) {
          out.e[j] = FromFloat<T>(ToFloat<T>(out.e[j]) + d);
        }
      }
      *out_p = out;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t e = 4 * q + j;
        if (e >= total) break;
        const int64_t r = e / cols, c = e - r * cols;
        const bool keep = DropoutKeeps(words.v[j], drop_below);
        const float d = Dropped(x[r * x_stride + c], keep, scale);
        T& out = y[r * y_stride + c];
        if (!accumulate) {
          out = FromFloat<T>(d);
        } else if (keep) {
          out = FromFloat<T>(ToFloat<T>(out) + d);
        }
      }
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
  const int64_t groups = (rows * cols + 3) / 4;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((groups + kThreads - 1) / kThreads, kMaxBlocks)));
  const cudaStream_t s = AsStream(stream);
  return DispatchDType(dtype, [&](auto tag) -> std::string {
    using T = decltype(tag);
    const T* xt = static_cast<const T*>(x);
    T* yt = static_cast<T*>(y);
    const uintptr_t quad = 4 * sizeof(T);
    const bool vector = cols % 4 == 0 && x_stride % 4 == 0 && y_stride % 4 == 0 &&
                        reinterpret_cast<uintptr_t>(x) % quad == 0 && reinterpret_cast<uintptr_t>(y) % quad == 0;
    if (vector) {
      DropoutRowsKernel<T, true>
          <<<grid, kThreads, 0, s>>>(xt, x_stride, yt, y_stride, rows, cols, philox, mask_index, drop_below, scale,
                                     accumulate);
    } else {
      DropoutRowsKernel<T, false>
          <<<grid, kThreads, 0, s>>>(xt, x_stride, yt, y_stride, rows, cols, philox, mask_index, drop_below, scale,
                                     accumulate);
    }
    return LaunchError("DropoutRows");
  });
}

}  // namespace trainerd::kernels
