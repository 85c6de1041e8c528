#include "engine/gemm.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#ifdef TRAINERD_WITH_HOPPER_GEMM
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "engine/kernels/hopper_gemm.h"
#endif

namespace trainerd::engine {
namespace {

std::atomic<int64_t> hopper_runs{0};

std::atomic<int>& Setting() {
  static std::atomic<int> level{[] {
    const char* v = std::getenv("TRAINERD_HOPPER_GEMM");
    if (v == nullptr) return 0;
    if (std::strcmp(v, "2") == 0) return 2;
    return std::strcmp(v, "1") == 0 ? 1 : 0;
  }()};
  return level;
}

#ifdef TRAINERD_WITH_HOPPER_GEMM
bool Bf16Rows(const torch::Tensor& t) {
  return t.is_cuda() && t.scalar_type() == torch::kBFloat16 && t.dim() == 2 && t.stride(1) == 1 &&
         t.stride(0) % 8 == 0 && t.stride(0) >= t.size(1) && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// Whether the GEMM of our own takes x w^T (w_transposed false: w (n, k)) or
// x w (w (k, n)) into an output of n columns (see the header).
bool Takes(const torch::Tensor& x, const torch::Tensor& w, bool w_transposed) {
  if (Setting().load(std::memory_order_relaxed) < 1 || x.dim() != 2 || w.dim() != 2 || !Bf16Rows(x) || !Bf16Rows(w) ||
      x.device() != w.device()) {
    return false;
  }
  const int64_t m = x.size(0), k = x.size(1), n = w_transposed ? w.size(1) : w.size(0);
  if (n % 8 != 0 || (w_transposed ? w.size(0) : w.size(1)) != k) return false;
  const c10::cuda::CUDAGuard guard(x.device());
  return kernels::HopperGemmSuits(m, n, k, w_transposed);
}

// out = x w^T or x w by the GEMM of our own, for operands it Takes; with
// h (SwiGLU, w as stored) h = silu(gate) * up of out = [gate | up] too.
void Run(torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& w, bool w_transposed,
         torch::Tensor* h = nullptr) {
  const c10::cuda::CUDAGuard guard(x.device());
  kernels::HopperGemmOperands o;
  o.x = x.data_ptr();
  o.x_stride = x.stride(0);
  o.w = w.data_ptr();
  o.w_stride = w.stride(0);
  o.w_transposed = w_transposed;
  o.d = out.data_ptr();
  o.d_stride = out.stride(0);
  o.m = x.size(0);
  o.n = out.size(1);
  o.k = x.size(1);
  if (h != nullptr) {
    o.h = h->data_ptr();
    o.h_stride = h->stride(0);
  }
  const std::string error =
      kernels::HopperGemm(o, h != nullptr ? kernels::HopperEpilogue::kSwiGlu : kernels::HopperEpilogue::kPlain,
                          c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(error.empty(), error);
  hopper_runs.fetch_add(1, std::memory_order_relaxed);
}
#else
bool Bf16Rows(const torch::Tensor&) { return false; }
bool Takes(const torch::Tensor&, const torch::Tensor&, bool) { return false; }
void Run(torch::Tensor&, const torch::Tensor&, const torch::Tensor&, bool, torch::Tensor* = nullptr) {}
#endif

}  // namespace

torch::Tensor ProductWithTransposed(const torch::Tensor& x, const torch::Tensor& w) {
  if (!Takes(x, w, /*w_transposed=*/false)) return torch::mm(x, w.t());
  torch::Tensor out = torch::empty({x.size(0), w.size(0)}, x.options());
  Run(out, x, w, /*w_transposed=*/false);
  return out;
}

torch::Tensor Product(const torch::Tensor& x, const torch::Tensor& w) {
  if (!Takes(x, w, /*w_transposed=*/true)) return torch::mm(x, w);
  torch::Tensor out = torch::empty({x.size(0), w.size(1)}, x.options());
  Run(out, x, w, /*w_transposed=*/true);
  return out;
}

void ProductInto(torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& w) {
  if (Takes(x, w, /*w_transposed=*/true) && Bf16Rows(out) && out.device() == x.device() && out.size(0) == x.size(0) &&
      out.size(1) == w.size(1)) {
    Run(out, x, w, /*w_transposed=*/true);
  } else {
    torch::mm_out(out, x, w);
  }
}

torch::Tensor ProductWithTransposedSwiGlu(const torch::Tensor& x, const torch::Tensor& w, int64_t h_spare_columns,
                                          torch::Tensor* h) {
  const int64_t f = w.dim() == 2 ? w.size(0) / 2 : 0;
  if (Setting().load(std::memory_order_relaxed) < 2 || f == 0 || w.size(0) % 16 != 0 || h_spare_columns % 8 != 0 ||
      !Takes(x, w, /*w_transposed=*/false)) {
    return {};
  }
  torch::Tensor rows = torch::empty({x.size(0), f + h_spare_columns}, x.options());
  torch::Tensor made = rows.narrow(1, 0, f);
  torch::Tensor out = torch::empty({x.size(0), w.size(0)}, x.options());
  Run(out, x, w, /*w_transposed=*/false, &made);
  *h = made;
  return out;
}

void SetHopperGemm(int level) { Setting().store(level); }

int64_t HopperGemmRuns() { return hopper_runs.load(); }

}  // namespace trainerd::engine
