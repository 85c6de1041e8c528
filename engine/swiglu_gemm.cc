#include "engine/swiglu_gemm.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#ifdef TRAINERD_WITH_HOPPER_GEMM
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "engine/kernels/hopper_gemm.h"
#endif

namespace trainerd::engine {
namespace {

std::atomic<int64_t> runs{0};

std::atomic<bool>& Setting() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("TRAINERD_HOPPER_GEMM");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }()};
  return on;
}

#ifdef TRAINERD_WITH_HOPPER_GEMM
bool Bf16Rows(const torch::Tensor& t) {
  return t.is_cuda() && t.scalar_type() == torch::kBFloat16 && t.dim() == 2 && t.stride(1) == 1 &&
         t.stride(0) % 8 == 0 && t.stride(0) >= t.size(1) && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// The header's conditions on the device and the shapes (the setting aside).
bool Takes(const torch::Tensor& x, const torch::Tensor& w, int64_t h_spare_columns) {
  if (!Bf16Rows(x) || !Bf16Rows(w) || x.device() != w.device() || w.size(1) != x.size(1) || w.size(0) % 16 != 0 ||
      h_spare_columns < 0 || h_spare_columns % 8 != 0) {
    return false;
  }
  const cudaDeviceProp* device = at::cuda::getDeviceProperties(x.device().index());
  if (device->major != 9 || device->minor != 0) return false;
  const int64_t m = x.size(0), n = w.size(0), k = x.size(1);
  const int64_t tiles = ((m + 127) / 128) * ((n + 255) / 256);
  return k >= 256 && tiles >= device->multiProcessorCount;
}
#endif

}  // namespace

torch::Tensor GateUpWithSwiGlu(const torch::Tensor& x, const torch::Tensor& w, int64_t h_spare_columns,
                               torch::Tensor* h) {
#ifdef TRAINERD_WITH_HOPPER_GEMM
  if (!Setting().load(std::memory_order_relaxed) || !Takes(x, w, h_spare_columns)) return {};
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t m = x.size(0), f = w.size(0) / 2;
  torch::Tensor rows = torch::empty({m, f + h_spare_columns}, x.options());
  torch::Tensor made = rows.narrow(1, 0, f);
  torch::Tensor out = torch::empty({m, 2 * f}, x.options());
  kernels::HopperGemmOperands o;
  o.x = x.data_ptr();
  o.x_stride = x.stride(0);
  o.w = w.data_ptr();
  o.w_stride = w.stride(0);
  o.d = out.data_ptr();
  o.d_stride = out.stride(0);
  o.h = made.data_ptr();
  o.h_stride = made.stride(0);
  o.m = m;
  o.n = 2 * f;
  o.k = x.size(1);
  const std::string error =
      kernels::HopperGemm(o, kernels::HopperEpilogue::kSwiGlu, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(error.empty(), error);
  runs.fetch_add(1, std::memory_order_relaxed);
  *h = made;
  return out;
#else
  (void)x;
  (void)w;
  (void)h_spare_columns;
  (void)h;
  return {};
#endif
}

void SetSwiGluGemm(bool on) { Setting().store(on); }

int64_t SwiGluGemmRuns() { return runs.load(); }

}  // namespace trainerd::engine
