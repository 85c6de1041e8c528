#include "engine/thin_products.h"

#include <string>

#ifdef TRAINERD_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "engine/kernels/thin_products.h"
#endif

namespace trainerd::engine {

namespace {

enum class ThinCase { kNone, kRight, kLeft };

#ifdef TRAINERD_WITH_CUDA_KERNELS
bool Sixteen(const torch::Tensor& t) {
  return t.defined() && t.is_cuda() && t.dim() == 2 &&
         (t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kFloat16);
}

// Rows of t (unit column stride) `ld` apart, fit for the kernels' 16-byte loads.
bool RowsOk(const torch::Tensor& t, int64_t ld) {
  return kernels::ThinProductLayoutOk(t.data_ptr(), ld) && ld >= t.size(1);
}
#endif

// Which kernel computes out = a b, if any (see the header).
ThinCase CaseOf(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b) {
#ifdef TRAINERD_WITH_CUDA_KERNELS
  if (!Sixteen(out) || !Sixteen(a) || !Sixteen(b)) return ThinCase::kNone;
  if (a.scalar_type() != b.scalar_type() || out.scalar_type() != a.scalar_type()) return ThinCase::kNone;
  if (a.device() != b.device() || out.device() != a.device()) return ThinCase::kNone;
  const int64_t p = a.size(0), q = a.size(1), s = b.size(1);
  if (b.size(0) != q || out.size(0) != p || out.size(1) != s) return ThinCase::kNone;
  if (p == 0 || q == 0 || s == 0 || out.stride(1) != 1 || out.stride(0) < s) return ThinCase::kNone;
  if (s <= kernels::kMaxThinRank && p > kernels::kMaxThinRank) {
    // y = x w^T: x = a row-major, w^T = b with one unit stride.
    if (a.stride(1) != 1 || !RowsOk(a, a.stride(0))) return ThinCase::kNone;
    const bool w_rows = b.stride(0) == 1, w_cols = b.stride(1) == 1;
    if (w_rows == w_cols) return ThinCase::kNone;  // both (s or q is 1) or neither: LibTorch's
    const int64_t ld = w_rows ? b.stride(1) : b.stride(0);
    if (!kernels::ThinProductLayoutOk(b.data_ptr(), ld) || ld < (w_rows ? q : s)) return ThinCase::kNone;
    return ThinCase::kRight;
  }
  if (p <= kernels::kMaxThinRank && s > kernels::kMaxThinRank) {
    // z = t^T g: t = a^T row-major (a's column stride its row distance), g = b row-major.
    if (a.stride(0) != 1 || b.stride(1) != 1) return ThinCase::kNone;
    if (!kernels::ThinProductLayoutOk(a.data_ptr(), a.stride(1)) || a.stride(1) < p) return ThinCase::kNone;
    if (!RowsOk(b, b.stride(0))) return ThinCase::kNone;
    return ThinCase::kLeft;
  }
#else
  (void)out;
  (void)a;
  (void)b;
#endif
  return ThinCase::kNone;
}

}  // namespace

bool ThinMmUsesKernel(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b) {
  return CaseOf(out, a, b) != ThinCase::kNone;
}

void ThinMmOut(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b) {
  const ThinCase c = CaseOf(out, a, b);
  if (c == ThinCase::kNone) {
    torch::Tensor target = out;
    at::mm_out(target, a, b);
    return;
  }
#ifdef TRAINERD_WITH_CUDA_KERNELS
  const c10::cuda::CUDAGuard guard(a.device());
  void* stream = c10::cuda::getCurrentCUDAStream(a.device().index()).stream();
  const kernels::DType dtype =
      a.scalar_type() == torch::kBFloat16 ? kernels::DType::kBFloat16 : kernels::DType::kFloat16;
  const int64_t p = a.size(0), q = a.size(1), s = b.size(1);
  std::string error;
  if (c == ThinCase::kRight) {
    const size_t bytes = kernels::ThinRightProductWorkspaceBytes(p, q, s);
    const torch::Tensor workspace =
        bytes > 0 ? torch::empty({static_cast<int64_t>(bytes / sizeof(float))}, a.options().dtype(torch::kFloat32))
                  : torch::Tensor();
    error = kernels::ThinRightProduct(a.data_ptr(), a.stride(0), b.data_ptr(), b.stride(1), b.stride(0),
                                      out.data_ptr(), out.stride(0), p, q, s,
                                      bytes > 0 ? workspace.data_ptr<float>() : nullptr, bytes, dtype, stream);
  } else {
    const size_t bytes = kernels::ThinLeftProductWorkspaceBytes(q, p, s);
    const torch::Tensor workspace =
        bytes > 0 ? torch::empty({static_cast<int64_t>(bytes / sizeof(float))}, a.options().dtype(torch::kFloat32))
                  : torch::Tensor();
    error = kernels::ThinLeftProduct(a.data_ptr(), a.stride(1), b.data_ptr(), b.stride(0), out.data_ptr(),
                                     out.stride(0), q, p, s, bytes > 0 ? workspace.data_ptr<float>() : nullptr, bytes,
                                     dtype, stream);
  }
  TORCH_CHECK(error.empty(), "thin product: ", error);
#endif
}

torch::Tensor ThinMm(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor out = torch::empty({a.size(0), b.size(1)}, a.options());
  ThinMmOut(out, a, b);
  return out;
}

}  // namespace trainerd::engine
