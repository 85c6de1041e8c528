// LoRA's side products of one llama3-8b decoder layer (LoRA on all seven
// projections), timed on the thin-product kernels (ThinMmOut) and on
// LibTorch's product (at::mm_out, cuBLAS), each operand laid out as the
// engine lays it out (the widened buffers' spare columns, sB read in place).
// Prints a Markdown table: microseconds a product, the bandwidth of the
// bytes each must move (the large operand read, the result written) and its
// share of the copy bandwidth measured in the same run.
//
//   thin_products_bench [tokens (8192)] [rank (16)]
//
// Each figure is the mean over 50 products after 10 warm-ups, timed between
// device synchronisations (the products are long enough, 10-100 us, that
// launches queue ahead of the GPU).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "engine/fused_ops.h"
#include "engine/thin_products.h"

namespace {

using trainerd::engine::ThinMmOut;
using trainerd::engine::ThinMmUsesKernel;

double MeanMicroseconds(const std::function<void()>& f) {
  for (int i = 0; i < 10; ++i) f();
  torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  constexpr int kRuns = 50;
  for (int i = 0; i < kRuns; ++i) f();
  torch::cuda::synchronize();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / kRuns;
}

// (rows, cols) of a fresh (rows, cols + spare) buffer: its left part.
torch::Tensor Rows(int64_t rows, int64_t cols, int64_t spare, const torch::TensorOptions& o) {
  return torch::randn({rows, cols + spare}, o).narrow(1, 0, cols);
}

struct Product {
  std::string name;
  torch::Tensor out, a, b;
  double bytes;  // what must move: the large operand read, the result written
};

}  // namespace

int main(int argc, char** argv) {
  if (!torch::cuda::is_available() || !trainerd::engine::FusedKernelsBuilt()) {
    std::fprintf(stderr, "thin_products_bench: needs a CUDA device and a build with the fused kernels\n");
    return 1;
  }
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 8192;
  const int64_t r = argc > 2 ? std::atoll(argv[2]) : 16;
  const int64_t d = 4096, kv = 1024, f = 14336;
  const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const int64_t qkv = d + 2 * kv, r3 = 3 * r, r2 = 2 * r;
  auto pad8 = [](int64_t c) { return (c + 7) / 8 * 8; };

  // Operands as the engine has them: the norms' outputs with the group's spare
  // columns (x, then t = x A^T in them), gradients with down's spare columns,
  // sB the B columns of a widened (out, in + spare) matrix.
  const torch::Tensor h_qkv = Rows(n, d, pad8(r3), o), h_gu = Rows(n, d, pad8(r2), o);
  const torch::Tensor attn = Rows(n, d, 0, o), act = Rows(n, f, pad8(r), o);
  const torch::Tensor a_qkv = torch::randn({r3, d}, o), a_o = torch::randn({r, d}, o);
  const torch::Tensor a_gu = torch::randn({r2, d}, o), a_down = torch::randn({r, f}, o);
  const torch::Tensor widened_o = torch::randn({d, d + pad8(r)}, o);
  const torch::Tensor widened_down = torch::randn({d + pad8(r), f + pad8(r)}, o);
  const torch::Tensor sb_o = widened_o.narrow(1, d, r), sb_down = widened_down.narrow(0, 0, d).narrow(1, f, r);
  const torch::Tensor g_qkv = Rows(n, qkv, 0, o), g_o = Rows(n, d, 0, o);
  const torch::Tensor g_gu = Rows(n, 2 * f, 0, o), g_down = Rows(n, d, pad8(r), o);
  const torch::Tensor t_qkv = Rows(n, r3, d, o), t_o = Rows(n, r, 0, o), t_gu = Rows(n, r2, d, o);
  const torch::Tensor t_down = Rows(n, r, f, o);
  const torch::Tensor u_qkv = Rows(n, r3, 0, o), u_o = Rows(n, r, 0, o), u_gu = Rows(n, r2, 0, o);
  const torch::Tensor u_down = Rows(n, r, d, o);

  auto big = [](const torch::Tensor& t) { return static_cast<double>(t.numel()) * 2.0; };
  auto thin = [&](int64_t rows, int64_t cols) { return torch::empty({rows, cols}, o); };
  std::vector<Product> products = {
      {"q|k|v x A^T (forward)", thin(n, r3), h_qkv, a_qkv.t(), 0},
      {"o x A^T (forward)", thin(n, r), attn, a_o.t(), 0},
      {"gate|up x A^T (forward)", thin(n, r2), h_gu, a_gu.t(), 0},
      {"down x A^T (forward)", thin(n, r), act, a_down.t(), 0},
      {"o u = g sB", thin(n, r), g_o, sb_o, 0},
      {"down u = g sB", thin(n, r), g_down, sb_down, 0},
      {"q|k|v t^T g", thin(r3, qkv), t_qkv.t(), g_qkv, 0},
      {"o t^T g", thin(r, d), t_o.t(), g_o, 0},
      {"gate|up t^T g", thin(r2, 2 * f), t_gu.t(), g_gu, 0},
      {"down t^T g", thin(r, d), t_down.t(), g_down, 0},
      {"q|k|v u^T h", thin(r3, d), u_qkv.t(), h_qkv, 0},
      {"o u^T x", thin(r, d), u_o.t(), attn, 0},
      {"gate|up u^T h", thin(r2, d), u_gu.t(), h_gu, 0},
      {"down u^T x", thin(r, f), u_down.t(), act, 0},
  };
  for (Product& p : products) {
    const bool left = p.a.size(0) < p.b.size(1) && p.a.size(0) <= 64;
    p.bytes = (left ? big(p.b) : big(p.a)) + big(p.out);
  }

  const torch::Tensor src = torch::empty({int64_t{1} << 29}, o), dst = torch::empty_like(src);
  const double copy_us = MeanMicroseconds([&] { dst.copy_(src); });
  const double copy_gbs = 2.0 * big(src) / copy_us / 1e3;
  std::printf("# LoRA side products of one llama3-8b layer: %lld tokens, rank %lld, bf16, %s\n\n",
              static_cast<long long>(n), static_cast<long long>(r),
              torch::cuda::device_count() > 0 ? "CUDA device 0" : "");
  std::printf("copy bandwidth (1 GiB device-to-device): %.0f GB/s\n\n", copy_gbs);
  std::printf("| product | MB moved | cuBLAS us | GB/s | kernel us | GB/s | share of copy | kernel / cuBLAS |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  double total_mm = 0, total_thin = 0;
  for (const Product& p : products) {
    torch::Tensor out = p.out;
    const double mm_us = MeanMicroseconds([&] { at::mm_out(out, p.a, p.b); });
    const bool kernel = ThinMmUsesKernel(p.out, p.a, p.b);
    const double thin_us = MeanMicroseconds([&] { ThinMmOut(p.out, p.a, p.b); });
    total_mm += mm_us;
    total_thin += thin_us;
    std::printf("| %s%s | %.0f | %.1f | %.0f | %.1f | %.0f | %.2f | %.2f |\n", p.name.c_str(),
                kernel ? "" : " (no kernel: LibTorch's)", p.bytes / 1e6, mm_us, p.bytes / mm_us / 1e3, thin_us,
                p.bytes / thin_us / 1e3, p.bytes / thin_us / 1e3 / copy_gbs, thin_us / mm_us);
  }
  std::printf("| all, one layer | | %.1f | | %.1f | | | %.2f |\n", total_mm, total_thin, total_thin / total_mm);
  std::printf("\nA step of 32 layers: cuBLAS %.2f ms, kernels %.2f ms.\n", 32 * total_mm / 1e3, 32 * total_thin / 1e3);
  return 0;
}
