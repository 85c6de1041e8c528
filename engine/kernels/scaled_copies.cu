// Many small scaled, casting 2-D copies in one launch (contract in fused_kernels.h).
//
// A launch takes up to kMaxScaledCopies copies by value (the kernel parameter
// block: no descriptor table to upload, so no host-to-device copy and no
// synchronisation). blockIdx.y picks the copy; the blocks along x stride over
// its elements in the destination's row-major order. Scalar accesses: these
// are LoRA-sized matrices (a few hundred thousand elements at most), where the
// launch, not the bandwidth, is the cost being saved.

#include <algorithm>
#include <climits>

#include "engine/kernels/dtype_access.cuh"

namespace trainerd::kernels {
namespace {

using namespace detail;  // NOLINT(build/namespaces)

constexpr int kThreads = 256;
constexpr int kMaxBlocksPerCopy = 64;

struct CopyBatch {
  ScaledCopy copy[kMaxScaledCopies];
};

template <typename S, typename D>
__global__ void __launch_bounds__(kThreads) ScaledCopiesKernel(const CopyBatch batch) {
  const ScaledCopy& c = batch.copy[blockIdx.y];
  const S* src = static_cast<const S*>(c.src);
  D* dst = static_cast<D*>(c.dst);
  const int64_t n = c.rows * c.cols;
  for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < n; e += int64_t{gridDim.x} * kThreads) {
    const int64_t r = e / c.cols, k = e - r * c.cols;
    // What LibTorch's mul_out(dst, src, scalar) computes: the product in
    // float32, rounded to the source's dtype (the op's common dtype: a scalar
    // does not promote), then cast to the destination's.
    // __fmul_rn: the product rounded on its own, never fused into the add below.
    const float product = __fmul_rn(ToFloat<S>(src[r * c.src_row_stride + k * c.src_col_stride]), c.scale);
    const D value = FromFloat<D>(RoundTo<S>(product));
    D& out = dst[r * c.dst_row_stride + k * c.dst_col_stride];
    out = c.accumulate ? FromFloat<D>(ToFloat<D>(out) + ToFloat<D>(value)) : value;
  }
}

}  // namespace

std::string ScaledCopies(const ScaledCopy* copies, int count, DType src_dtype, DType dst_dtype, void* stream) {
  if (count < 0 || count > kMaxScaledCopies) {
    return "ScaledCopies: " + std::to_string(count) + " copies (at most " + std::to_string(kMaxScaledCopies) + ")";
  }
  CopyBatch batch{};
  int64_t most = 0;
  int used = 0;
  for (int i = 0; i < count; ++i) {
    const ScaledCopy& c = copies[i];
    if (c.rows < 0 || c.cols < 0) return "ScaledCopies: copy " + std::to_string(i) + " has negative sizes";
    if (c.rows == 0 || c.cols == 0) continue;
    if (!c.src || !c.dst) return "ScaledCopies: copy " + std::to_string(i) + " has a null pointer";
    batch.copy[used++] = c;
    most = std::max(most, c.rows * c.cols);
  }
  if (used == 0) return {};
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((most + kThreads - 1) / kThreads, kMaxBlocksPerCopy)),
                  static_cast<unsigned>(used));
  const cudaStream_t s = AsStream(stream);
  return DispatchDType(src_dtype, [&](auto src_tag) -> std::string {
    using S = decltype(src_tag);
    return DispatchDType(dst_dtype, [&](auto dst_tag) -> std::string {
      using D = decltype(dst_tag);
      ScaledCopiesKernel<S, D><<<grid, kThreads, 0, s>>>(batch);
      return LaunchError("ScaledCopies");
    });
  });
}

}  // namespace trainerd::kernels
