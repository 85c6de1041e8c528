// Checks the Hopper GEMM (engine/kernels/hopper_gemm.h: D = X W^T in bf16
// with float32 accumulation, W as stored or transposed, SwiGLU's forward or
// backward or the rotary embedding as an optional epilogue) against cuBLAS
// (and the pass each epilogue replaces) and float64, and times it beside
// cuBLAS at the 8b row's shapes. The question it answers (bench/speed/NOTES.md,
// "SwiGLU inside the GEMMs"): does a kernel of ours run these GEMMs as fast as
// cuBLAS, so that the SwiGLU passes can move into its epilogues?
//
// Build and run on the GPU machine, from the repository root:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo -I. -o /tmp/hopper_gemm
//        bench/gemm/hopper_gemm.cu engine/kernels/hopper_gemm.cu -lcublas -ldl
// (or the CMake build's hopper_gemm_bench, built wherever nvcc and cuBLAS are)
//   /tmp/hopper_gemm            # every check, then every timing
//   /tmp/hopper_gemm check | time [NAME PART]   # one of them; timings of some cases
//   /tmp/hopper_gemm energy [NAME PART]   # joules a launch at the power cap (NVML)
//   /tmp/hopper_gemm waves   # time against the number of tiles (the last round's cost)
// The kernel's compile-time knobs (-D; engine/kernels/hopper_gemm.cu) build
// variants to time: HG_BACKWARD_TMA, HG_BACKWARD_UNITS (SwiGLU's backward
// epilogue), HG_STAGES, HG_GROUP, HG_FAST_SILU.
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda_check.h"
#include "bench/nvml_energy.h"
#include "engine/kernels/hopper_gemm.h"

namespace {

using trainerd::kernels::HopperEpilogue;
using trainerd::kernels::HopperGemmOperands;

// h = silu(gate) * up over D = [gate | up] (M, 2F), eight elements a thread
// with 16-byte accesses (F a multiple of 8): the pass the epilogue replaces.
__global__ void SwiGluPass(const __nv_bfloat16* d, __nv_bfloat16* h, int64_t m, int64_t f) {
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * 8;
  if (i >= m * f) return;
  const int64_t row = i / f, col = i % f;
  const uint4 g8 = *reinterpret_cast<const uint4*>(d + row * 2 * f + col);
  const uint4 u8 = *reinterpret_cast<const uint4*>(d + row * 2 * f + f + col);
  const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&g8);
  const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&u8);
  uint4 out;
  __nv_bfloat162* h2 = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 g = __bfloat1622float2(g2[j]), u = __bfloat1622float2(u2[j]);
    h2[j] = __floats2bfloat162_rn(g.x / (1.0f + __expf(-g.x)) * u.x, g.y / (1.0f + __expf(-g.y)) * u.y);
  }
  *reinterpret_cast<uint4*>(h + i) = out;
}

void SwiGluReference(const __nv_bfloat16* d, __nv_bfloat16* h, int m, int n, cudaStream_t stream) {
  const int64_t count = static_cast<int64_t>(m) * (n / 2) / 8;
  SwiGluPass<<<static_cast<unsigned>((count + 255) / 256), 256, 0, stream>>>(d, h, m, n / 2);
  CHECK_CUDA(cudaGetLastError());
}

// SwiGLU's backward after dh = X W^T (M, F), as engine/kernels/swiglu.cu
// computes it (accurate expf, each result rounded once), eight elements a
// thread with 16-byte accesses (F a multiple of 8): the pass the backward
// epilogue replaces, reading dh and [gate | up] (M, 2F), writing [dgate | dup].
__global__ void SwiGluBackwardPass(const __nv_bfloat16* dh, const __nv_bfloat16* gate_up, __nv_bfloat16* grad,
                                   int64_t m, int64_t f) {
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * 8;
  if (i >= m * f) return;
  const int64_t row = i / f, col = i % f;
  __nv_bfloat16 d[8], g[8], u[8], dg[8], du[8];
  *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(dh + i);
  *reinterpret_cast<uint4*>(g) = *reinterpret_cast<const uint4*>(gate_up + row * 2 * f + col);
  *reinterpret_cast<uint4*>(u) = *reinterpret_cast<const uint4*>(gate_up + row * 2 * f + f + col);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float dj = __bfloat162float(d[j]), gj = __bfloat162float(g[j]), uj = __bfloat162float(u[j]);
    const float s = 1.f / (1.f + expf(-gj));
    dg[j] = __float2bfloat16_rn(dj * uj * s * (1.f + gj * (1.f - s)));
    du[j] = __float2bfloat16_rn(dj * gj * s);
  }
  *reinterpret_cast<uint4*>(grad + row * 2 * f + col) = *reinterpret_cast<const uint4*>(dg);
  *reinterpret_cast<uint4*>(grad + row * 2 * f + f + col) = *reinterpret_cast<const uint4*>(du);
}

// The rotary embedding after q|k|v = X W^T (M, N), as the engine's pass does
// it (engine/kernels/rope.cu: cos and sin of position * inv_freq rounded to
// bf16; q's and k's heads rotated, v's copied, into a new (M, N) tensor):
// the pass the rotary epilogue replaces. Heads of 128 columns; a thread
// takes 8 elements of a head's first half and their partners.
__global__ void RopePass(const __nv_bfloat16* d, __nv_bfloat16* out, const int64_t* positions,
                         const float* inv_freq, int64_t m, int64_t n, int64_t rotate_columns) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // (row, head, unit of 8)
  if (i >= m * (n / 128) * 8) return;
  const int64_t row = i / ((n / 128) * 8), head = (i / 8) % (n / 128);
  const int i0 = static_cast<int>(i % 8) * 8;
  const int64_t lo = row * n + head * 128 + i0;
  __nv_bfloat16 a[8], b[8];
  *reinterpret_cast<uint4*>(a) = *reinterpret_cast<const uint4*>(d + lo);
  *reinterpret_cast<uint4*>(b) = *reinterpret_cast<const uint4*>(d + lo + 64);
  if (head * 128 < rotate_columns) {
    const float p = static_cast<float>(positions[row]);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float f = p * inv_freq[i0 + e];
      const float c = __bfloat162float(__float2bfloat16_rn(cosf(f)));
      const float sn = __bfloat162float(__float2bfloat16_rn(sinf(f)));
      const float x = __bfloat162float(a[e]), y = __bfloat162float(b[e]);
      a[e] = __float2bfloat16_rn(x * c - y * sn);
      b[e] = __float2bfloat16_rn(y * c + x * sn);
    }
  }
  *reinterpret_cast<uint4*>(out + lo) = *reinterpret_cast<const uint4*>(a);
  *reinterpret_cast<uint4*>(out + lo + 64) = *reinterpret_cast<const uint4*>(b);
}

struct Buffers {
  __nv_bfloat16 *x = nullptr, *w = nullptr, *d = nullptr, *h = nullptr, *d_ref = nullptr, *h_ref = nullptr;
  // SwiGLU's backward: the forward's [gate | up] and the pass's [dgate | dup],
  // (M, 2N); D, ours, is (M, 2N) too, and d_ref cuBLAS's dh (M, N).
  __nv_bfloat16 *gate_up = nullptr, *grad_ref = nullptr;
  // Rotary: each row's position (row % 2048, the 8b row's sequences), the
  // 64 frequencies of llama3's theta 500,000, and the pass's output (M, N).
  int64_t* positions = nullptr;
  float* inv_freq = nullptr;
  __nv_bfloat16* rope_ref = nullptr;
  std::vector<__nv_bfloat16> host_x, host_w;
};

// Uniform values in [-scale, scale) from a hash of the index: operands for
// timings, made on the device (the 8b shapes' W has 118M elements).
__global__ void Fill(__nv_bfloat16* p, int64_t count, uint32_t seed, float scale) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  uint32_t v = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  v ^= v >> 16;
  v *= 0x7feb352du;
  v ^= v >> 15;
  v *= 0x846ca68bu;
  v ^= v >> 16;
  p[i] = __float2bfloat16((static_cast<float>(v) * (2.0f / 4294967296.0f) - 1.0f) * scale);
}

// X (M, K) and W (N, K) random (X's elements of size about 1, W's about
// 1/sqrt(K), so that D's are about 1): on the host, kept for the float64
// samples, or (on_device) made on the device.
Buffers Allocate(int m, int n, int k, HopperEpilogue epilogue, uint32_t seed, bool on_device = false) {
  const bool swiglu = epilogue == HopperEpilogue::kSwiGlu, backward = epilogue == HopperEpilogue::kSwiGluBackward;
  Buffers b;
  const size_t x_count = static_cast<size_t>(m) * k, w_count = static_cast<size_t>(n) * k;
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(k));
  CHECK_CUDA(cudaMalloc(&b.x, x_count * 2));
  CHECK_CUDA(cudaMalloc(&b.w, w_count * 2));
  if (on_device) {
    Fill<<<static_cast<unsigned>((x_count + 255) / 256), 256>>>(b.x, x_count, seed, 1.7f);
    Fill<<<static_cast<unsigned>((w_count + 255) / 256), 256>>>(b.w, w_count, seed + 1, 1.7f * w_scale);
    CHECK_CUDA(cudaGetLastError());
  } else {
    b.host_x.resize(x_count);
    b.host_w.resize(w_count);
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& v : b.host_x) v = __float2bfloat16(normal(rng));
    for (auto& v : b.host_w) v = __float2bfloat16(normal(rng) * w_scale);
    CHECK_CUDA(cudaMemcpy(b.x, b.host_x.data(), x_count * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(b.w, b.host_w.data(), w_count * 2, cudaMemcpyHostToDevice));
  }
  CHECK_CUDA(cudaMalloc(&b.d, static_cast<size_t>(m) * n * (backward ? 2 : 1) * 2));
  CHECK_CUDA(cudaMalloc(&b.d_ref, static_cast<size_t>(m) * n * 2));
  if (backward) {
    const size_t count = static_cast<size_t>(m) * 2 * n;
    CHECK_CUDA(cudaMalloc(&b.gate_up, count * 2));
    CHECK_CUDA(cudaMalloc(&b.grad_ref, count * 2));
    Fill<<<static_cast<unsigned>((count + 255) / 256), 256>>>(b.gate_up, count, seed + 2, 4.0f);
    CHECK_CUDA(cudaGetLastError());
  }
  if (swiglu) {
    CHECK_CUDA(cudaMalloc(&b.h, static_cast<size_t>(m) * (n / 2) * 2));
    CHECK_CUDA(cudaMalloc(&b.h_ref, static_cast<size_t>(m) * (n / 2) * 2));
  }
  if (epilogue == HopperEpilogue::kRope) {
    std::vector<int64_t> positions(m);
    for (int i = 0; i < m; ++i) positions[i] = i % 2048;
    std::vector<float> inv_freq(64);
    for (int i = 0; i < 64; ++i) inv_freq[i] = static_cast<float>(std::pow(500000.0, -i / 64.0));
    CHECK_CUDA(cudaMalloc(&b.positions, m * sizeof(int64_t)));
    CHECK_CUDA(cudaMalloc(&b.inv_freq, 64 * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&b.rope_ref, static_cast<size_t>(m) * n * 2));
    CHECK_CUDA(cudaMemcpy(b.positions, positions.data(), m * sizeof(int64_t), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(b.inv_freq, inv_freq.data(), 64 * sizeof(float), cudaMemcpyHostToDevice));
  }
  return b;
}

void Free(Buffers& b) {
  for (__nv_bfloat16* p : {b.x, b.w, b.d, b.h, b.d_ref, b.h_ref, b.gate_up, b.grad_ref, b.rope_ref}) {
    if (p != nullptr) CHECK_CUDA(cudaFree(p));
  }
  if (b.positions != nullptr) CHECK_CUDA(cudaFree(b.positions));
  if (b.inv_freq != nullptr) CHECK_CUDA(cudaFree(b.inv_freq));
}

std::vector<float> Download(const __nv_bfloat16* p, size_t count) {
  std::vector<__nv_bfloat16> raw(count);
  CHECK_CUDA(cudaMemcpy(raw.data(), p, count * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = __bfloat162float(raw[i]);
  return out;
}

// Ours against cuBLAS element by element: the worst difference relative to the
// output's largest magnitude, and the share of elements differing by more than
// 2 bf16 ulps of their own size (accumulation order alone moves a few by one).
struct Comparison {
  double worst_relative = 0, share_off = 0;
  bool nan = false;
};

Comparison Compare(const std::vector<float>& ours, const std::vector<float>& reference) {
  Comparison c;
  double scale = 0;
  for (float v : reference) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  size_t off = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    if (!std::isfinite(ours[i])) c.nan = true;
    const double diff = std::fabs(static_cast<double>(ours[i]) - reference[i]);
    c.worst_relative = std::max(c.worst_relative, diff / std::max(scale, 1e-30));
    if (diff > 2 * std::ldexp(1.0, -7) * std::fabs(reference[i]) + 1e-6 * scale) ++off;
  }
  c.share_off = ours.empty() ? 0 : static_cast<double>(off) / ours.size();
  return c;
}

// A float64 product of a few sampled elements, so that a fault shared by
// cuBLAS and ours (a map or layout error in the harness) shows too.
double SampledError(const Buffers& b, const std::vector<float>& d, int m, int n, int k) {
  std::mt19937 rng(7);
  double worst = 0;
  for (int s = 0; s < 64; ++s) {
    const int i = static_cast<int>(rng() % m), j = static_cast<int>(rng() % n);
    double sum = 0, magnitude = 0;
    for (int p = 0; p < k; ++p) {
      const double term = static_cast<double>(__bfloat162float(b.host_x[static_cast<size_t>(i) * k + p])) *
                          __bfloat162float(b.host_w[static_cast<size_t>(j) * k + p]);
      sum += term;
      magnitude += std::fabs(term);
    }
    worst = std::max(worst, std::fabs(d[static_cast<size_t>(i) * n + j] - sum) / std::max(magnitude, 1e-30));
  }
  return worst;
}

// W (n, k) into W^T (k, n).
__global__ void Transpose(const __nv_bfloat16* w, __nv_bfloat16* w_t, int64_t n, int64_t k) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * k) return;
  const int64_t row = i / k, col = i % k;
  w_t[col * n + row] = w[i];
}

struct Case {
  const char* name;
  HopperEpilogue epilogue;
  bool w_transposed;  // W handed over as (k, n), to ours and to cuBLAS alike
  int m, n, k;
  int rotate_columns = 0;  // rotary: q's and k's columns
  // SwiGLU's backward: with LoRA's sums (ranks 16 + 16 of gate|up's t, 16 of down's u); SwiGLU's forward: with
  // down's LoRA product over h (rank 16)
  bool lora_sums = false;
};

// One product: ours, or cuBLAS's (plus the SwiGLU pass where the case has it
// and `with_pass`).
struct Contest {
  Case c;
  Buffers b;
  __nv_bfloat16* w_t = nullptr;
  __nv_bfloat16 *lora_t = nullptr, *lora_u = nullptr;  // (m, 32), (m, 16): LoRA's sums' thin operands
  float* lora_sums = nullptr;                          // (32 + 16, n); SwiGLU's forward: (m, 16)
  __nv_bfloat16* down_a = nullptr;                     // SwiGLU's forward: down's A (16, n / 2)
  __nv_bfloat16* down_t = nullptr;                     // and cuBLAS's thin product h A^T (m, 16)
  cublasHandle_t handle{};

  bool DownLora() const { return c.lora_sums && c.epilogue == HopperEpilogue::kSwiGlu; }

  Contest(const Case& c_, bool on_device) : c(c_) {
    b = Allocate(c.m, c.n, c.k, c.epilogue, 1234u + c.m + c.n + c.k, on_device);
    if (DownLora()) {
      const int64_t a_count = static_cast<int64_t>(16) * (c.n / 2);
      CHECK_CUDA(cudaMalloc(&down_a, a_count * 2));
      CHECK_CUDA(cudaMalloc(&down_t, static_cast<int64_t>(c.m) * 16 * 2));
      CHECK_CUDA(cudaMalloc(&lora_sums, static_cast<int64_t>(c.m) * 16 * 4));
      Fill<<<static_cast<unsigned>((a_count + 255) / 256), 256>>>(down_a, a_count, 79u, 0.05f);
      CHECK_CUDA(cudaGetLastError());
    } else if (c.lora_sums) {
      CHECK_CUDA(cudaMalloc(&lora_t, static_cast<int64_t>(c.m) * 32 * 2));
      CHECK_CUDA(cudaMalloc(&lora_u, static_cast<int64_t>(c.m) * 16 * 2));
      CHECK_CUDA(cudaMalloc(&lora_sums, static_cast<int64_t>(48) * c.n * 4));
      Fill<<<static_cast<unsigned>((c.m * 32 + 255) / 256), 256>>>(lora_t, static_cast<int64_t>(c.m) * 32, 77u, 1.0f);
      Fill<<<static_cast<unsigned>((c.m * 16 + 255) / 256), 256>>>(lora_u, static_cast<int64_t>(c.m) * 16, 78u, 1.0f);
      CHECK_CUDA(cudaGetLastError());
    }
    if (c.w_transposed) {
      const int64_t count = static_cast<int64_t>(c.n) * c.k;
      CHECK_CUDA(cudaMalloc(&w_t, count * 2));
      Transpose<<<static_cast<unsigned>((count + 255) / 256), 256>>>(b.w, w_t, c.n, c.k);
      CHECK_CUDA(cudaGetLastError());
    }
    cublasCreate(&handle);
  }
  ~Contest() {
    cublasDestroy(handle);
    if (w_t != nullptr) cudaFree(w_t);
    for (void* p : {static_cast<void*>(lora_t), static_cast<void*>(lora_u), static_cast<void*>(lora_sums),
                    static_cast<void*>(down_a), static_cast<void*>(down_t)}) {
      if (p != nullptr) cudaFree(p);
    }
    Free(b);
  }

  void Ours(cudaStream_t stream) {
    HopperGemmOperands o;
    o.x = b.x;
    o.x_stride = c.k;
    o.w = c.w_transposed ? w_t : b.w;
    o.w_stride = c.w_transposed ? c.n : c.k;
    o.w_transposed = c.w_transposed;
    o.d = b.d;
    o.d_stride = c.epilogue == HopperEpilogue::kSwiGluBackward ? 2 * c.n : c.n;
    o.gate_up = b.gate_up;
    o.gate_up_stride = 2 * c.n;
    o.h = b.h;
    o.h_stride = c.n / 2;
    o.positions = b.positions;
    o.inv_freq = b.inv_freq;
    o.rotate_columns = c.rotate_columns;
    if (DownLora()) {
      o.lora_a = down_a;
      o.lora_a_stride = c.n / 2;
      o.rank_h = 16;
      o.lora_h_sums = lora_sums;
      o.lora_h_sums_stride = 16;
    } else if (c.lora_sums) {
      o.lora_t = lora_t;
      o.lora_t_stride = 32;
      o.rank_gate = o.rank_up = 16;
      o.lora_b_sums = lora_sums;
      o.lora_u = lora_u;
      o.lora_u_stride = 16;
      o.rank_h = 16;
      o.lora_a_sums = lora_sums + static_cast<int64_t>(32) * c.n;
    }
    o.m = c.m;
    o.n = c.n;
    o.k = c.k;
    const std::string why = trainerd::kernels::HopperGemm(o, c.epilogue, stream);
    if (!why.empty()) {
      std::fprintf(stderr, "%s: %s\n", c.name, why.c_str());
      std::exit(1);
    }
  }

  // cuBLAS, column-major: D^T (n, m) = op(W) X^T, W (n, k) row-major being
  // (k, n) column-major (op T), W^T (k, n) row-major being (n, k) (op N).
  void Cublas(cudaStream_t stream) {
    cublasSetStream(handle, stream);
    const float one = 1.0f, zero = 0.0f;
    const cublasStatus_t s =
        c.w_transposed
            ? cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, c.n, c.m, c.k, &one, w_t, CUDA_R_16BF, c.n, b.x,
                           CUDA_R_16BF, c.k, &zero, b.d_ref, CUDA_R_16BF, c.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
            : cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, c.n, c.m, c.k, &one, b.w, CUDA_R_16BF, c.k, b.x,
                           CUDA_R_16BF, c.k, &zero, b.d_ref, CUDA_R_16BF, c.n, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasGemmEx failed: %d\n", static_cast<int>(s));
      std::exit(1);
    }
  }

  // Down's thin product t = h A^T (m, 16) on cuBLAS, over `h` (m, n / 2), into
  // out of `type` (bf16 as the engine's, or float32 for the check).
  void ThinProduct(const __nv_bfloat16* h, void* out, cudaDataType type, cudaStream_t stream) {
    cublasSetStream(handle, stream);
    const float one = 1.0f, zero = 0.0f;
    const int f = c.n / 2;
    const cublasStatus_t s = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, 16, c.m, f, &one, down_a, CUDA_R_16BF, f,
                                          h, CUDA_R_16BF, f, &zero, out, type, 16, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasGemmEx (thin) failed: %d\n", static_cast<int>(s));
      std::exit(1);
    }
  }

  void Pass(cudaStream_t stream) {
    if (c.epilogue == HopperEpilogue::kRope) {
      const int64_t threads = static_cast<int64_t>(c.m) * (c.n / 128) * 8;
      RopePass<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
          b.d_ref, b.rope_ref, b.positions, b.inv_freq, c.m, c.n, c.rotate_columns);
      CHECK_CUDA(cudaGetLastError());
      return;
    }
    if (c.epilogue == HopperEpilogue::kSwiGlu) {
      SwiGluReference(b.d_ref, b.h_ref, c.m, c.n, stream);
      if (DownLora()) ThinProduct(b.h_ref, down_t, CUDA_R_16BF, stream);  // the pass down's node runs over h
      return;
    }
    const int64_t threads = static_cast<int64_t>(c.m) * c.n / 8;
    SwiGluBackwardPass<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(b.d_ref, b.gate_up,
                                                                                        b.grad_ref, c.m, c.n);
    CHECK_CUDA(cudaGetLastError());
  }

  // The contestants timed against each other: ours (0), cuBLAS's GEMM (1)
  // and, where the case has an epilogue (SwiGLU's forward or backward, the
  // rotary), the pass after it (2).
  int Contestants() const { return c.epilogue == HopperEpilogue::kPlain ? 2 : 3; }
  void Launch(int who, cudaStream_t stream) {
    if (who == 0) Ours(stream);
    if (who == 1) Cublas(stream);
    if (who == 2) Pass(stream);
  }
};

// Ours (into D full of NaNs, so that what it leaves unwritten shows),
// cuBLAS's product and the pass after it, finished.
void RunContestants(Contest& t, size_t d_count) {
  CHECK_CUDA(cudaMemset(t.b.d, 0xFF, d_count * 2));
  t.Ours(nullptr);
  t.Cublas(nullptr);
  t.Pass(nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
}

// SwiGLU's backward: ours against cuBLAS's dh and the pass after it (the
// products themselves are checked by the W^T cases).
bool CheckBackward(const Case& c) {
  const size_t count = static_cast<size_t>(c.m) * 2 * c.n;
  Contest t(c, /*on_device=*/false);
  RunContestants(t, count);
  const Comparison cg = Compare(Download(t.b.d, count), Download(t.b.grad_ref, count));
  const bool ok = !cg.nan && cg.worst_relative < 1e-2 && cg.share_off < 1e-3;
  std::printf("check %-22s %5d x %5d x %5d: dgate|dup worst %.2e of max, %.4f%% off by > 2 ulp%s %s\n", c.name, c.m,
              c.n, c.k, cg.worst_relative, 100 * cg.share_off, cg.nan ? ", NaN" : "", ok ? "ok" : "FAILED");
  return ok;
}

// The rotary epilogue: ours against cuBLAS's product and the pass after it
// (the product's own rounding is checked by the plain cases), and v's
// columns, unrotated, against cuBLAS's product alone.
bool CheckRope(const Case& c) {
  const size_t count = static_cast<size_t>(c.m) * c.n;
  Contest t(c, /*on_device=*/false);
  RunContestants(t, count);
  const std::vector<float> ours = Download(t.b.d, count);
  const Comparison cr = Compare(ours, Download(t.b.rope_ref, count));
  // Rotation moves values between a head's halves: the same comparison over
  // v's columns alone would not show a rotated v; this does.
  const std::vector<float> product = Download(t.b.d_ref, count);
  std::vector<float> ours_v, product_v;
  for (size_t i = 0; i < count; ++i) {
    if (static_cast<int>(i % c.n) >= c.rotate_columns) {
      ours_v.push_back(ours[i]);
      product_v.push_back(product[i]);
    }
  }
  const Comparison cv = Compare(ours_v, product_v);
  const bool ok = !cr.nan && cr.worst_relative < 1e-2 && cr.share_off < 1e-3 && cv.worst_relative < 1e-2 &&
                  cv.share_off < 1e-3;
  std::printf("check %-22s %5d x %5d x %5d (rotated %d): D worst %.2e of max, %.4f%% off by > 2 ulp%s; "
              "v's columns %.2e, %.4f%% off %s\n",
              c.name, c.m, c.n, c.k, c.rotate_columns, cr.worst_relative, 100 * cr.share_off, cr.nan ? ", NaN" : "",
              cv.worst_relative, 100 * cv.share_off, ok ? "ok" : "FAILED");
  return ok;
}

bool Check(const Case& c) {
  const bool swiglu = c.epilogue == HopperEpilogue::kSwiGlu;
  const int m = c.m, n = c.n, k = c.k;
  if (c.epilogue == HopperEpilogue::kSwiGluBackward) return CheckBackward(c);
  if (c.epilogue == HopperEpilogue::kRope) return CheckRope(c);
  Contest t(c, /*on_device=*/false);
  CHECK_CUDA(cudaMemset(t.b.d, 0xFF, static_cast<size_t>(m) * n * 2));  // NaNs where nothing is written
  if (swiglu) CHECK_CUDA(cudaMemset(t.b.h, 0xFF, static_cast<size_t>(m) * (n / 2) * 2));
  t.Ours(nullptr);
  t.Cublas(nullptr);
  if (swiglu) t.Pass(nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<float> d = Download(t.b.d, static_cast<size_t>(m) * n);
  const Comparison cd = Compare(d, Download(t.b.d_ref, static_cast<size_t>(m) * n));
  const double sampled = SampledError(t.b, d, m, n, k);
  bool ok = !cd.nan && cd.worst_relative < 1e-2 && cd.share_off < 1e-3 && sampled < 1e-2;
  std::printf("check %-22s %5d x %5d x %5d: D worst %.2e of max, %.4f%% off by > 2 ulp, float64 samples %.2e%s",
              c.name, m, n, k, cd.worst_relative, 100 * cd.share_off, sampled, cd.nan ? ", NaN" : "");
  if (swiglu) {
    const size_t count = static_cast<size_t>(m) * (n / 2);
    const Comparison ch = Compare(Download(t.b.h, count), Download(t.b.h_ref, count));
    ok = ok && !ch.nan && ch.worst_relative < 1e-2 && ch.share_off < 1e-3;
    std::printf("; H worst %.2e, %.4f%% off%s", ch.worst_relative, 100 * ch.share_off, ch.nan ? ", NaN" : "");
  }
  if (t.DownLora()) {
    // Down's product over our own h: cuBLAS's in float32 against our sums
    // (the same bf16 operands, another summation order).
    const size_t count = static_cast<size_t>(m) * 16;
    float* reference = nullptr;
    CHECK_CUDA(cudaMalloc(&reference, count * 4));
    t.ThinProduct(t.b.h, reference, CUDA_R_32F, nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<float> ours(count), theirs(count);
    CHECK_CUDA(cudaMemcpy(ours.data(), t.lora_sums, count * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(theirs.data(), reference, count * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaFree(reference));
    const Comparison ct = Compare(ours, theirs);
    ok = ok && !ct.nan && ct.worst_relative < 1e-4;
    std::printf("; down's h A^T worst %.2e of max%s", ct.worst_relative, ct.nan ? ", NaN" : "");
  }
  std::printf(" %s\n", ok ? "ok" : "FAILED");
  return ok;
}

// Milliseconds a launch: ours, cuBLAS's GEMM, and (SwiGLU) the pass after it,
// alternating in rounds so that all see the same clocks (the card runs GEMMs
// at its power limit).
void Time(const Case& c) {
  const bool swiglu = c.epilogue != HopperEpilogue::kPlain;
  Contest t(c, /*on_device=*/true);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  constexpr int kRounds = 5, kReps = 20;
  double ms_each[3] = {0, 0, 0};
  for (int round = -1; round < kRounds; ++round) {  // round -1 warms up
    for (int who = 0; who < t.Contestants(); ++who) {
      CHECK_CUDA(cudaEventRecord(start, stream));
      for (int r = 0; r < kReps; ++r) t.Launch(who, stream);
      CHECK_CUDA(cudaEventRecord(stop, stream));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      if (round >= 0) ms_each[who] += ms / kReps / kRounds;
    }
  }
  const double flops = 2.0 * c.m * c.n * static_cast<double>(c.k);
  std::printf("time %-22s %5d x %5d x %5d: ours %.3f ms (%.0f TFLOP/s), cuBLAS %.3f ms (%.0f): ours/cuBLAS %.3f",
              c.name, c.m, c.n, c.k, ms_each[0], flops / ms_each[0] / 1e9, ms_each[1], flops / ms_each[1] / 1e9,
              ms_each[0] / ms_each[1]);
  if (swiglu) {
    std::printf("; SwiGLU pass%s %.3f ms: ours/(cuBLAS + pass) %.3f", t.DownLora() ? " and the thin h A^T" : "",
                ms_each[2],
                ms_each[0] / (ms_each[1] + ms_each[2]));
  }
  std::printf("\n");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
}

// Each contestant run back to back for a few seconds, as a training step runs
// its GEMMs (at the card's power cap): milliseconds and joules a launch, with
// the power and SM clock sampled meanwhile. At the cap, joules a launch is
// what sets a step's time; a kernel faster alone but not cheaper in energy
// gains nothing there.
void Energy(const Case& c, const Nvml& nvml) {
  Contest t(c, /*on_device=*/true);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  const char* names[3] = {"ours", "cuBLAS", "pass"};
  constexpr double kSeconds = 3.0;
  constexpr int kRounds = 3;
  double ms_later[3] = {0, 0, 0}, joules_later[3] = {0, 0, 0};  // means over rounds 1.. (a warm card)
  for (int round = 0; round < kRounds; ++round) {  // ours, cuBLAS, ours, cuBLAS, ...: drift shows
    for (int who = 0; who < t.Contestants(); ++who) {
      const EnergyReading r = BackToBack(nvml, stream, kSeconds, [&] { t.Launch(who, stream); });
      std::printf("energy %-22s %-6s %5d x %5d x %5d: %.3f ms, %.3f J a launch, %.0f W, %.0f MHz (%ld launches)\n",
                  c.name, names[who], c.m, c.n, c.k, r.ms, r.joules, r.watts, r.mhz, r.launches);
      if (round > 0) {
        ms_later[who] += r.ms / (kRounds - 1);
        joules_later[who] += r.joules / (kRounds - 1);
      }
    }
  }
  // The first round starts from a cooler card; the verdict is the later rounds'.
  const double ms_theirs = ms_later[1] + ms_later[2], joules_theirs = joules_later[1] + joules_later[2];
  std::printf("energy %-22s later rounds: ours %.3f ms, %.3f J; cuBLAS%s %.3f ms, %.3f J: ours/theirs %.3f in time, "
              "%.3f in joules\n",
              c.name, ms_later[0], joules_later[0], t.Contestants() > 2 ? " + pass" : "", ms_theirs, joules_theirs,
              ms_later[0] / ms_theirs, joules_later[0] / joules_theirs);
  cudaStreamDestroy(stream);
}

}  // namespace

int main(int argc, char** argv) {
  // A line at a time, also into a file: a run cut short by a timeout still shows where it was.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string what = argc > 1 ? argv[1] : "all";
  const std::string only = argc > 2 ? argv[2] : "";  // time or energy: the case of this name, else those holding it
  if (what != "all" && what != "check" && what != "time" && what != "energy" && what != "waves") {
    std::fprintf(stderr, "unknown mode '%s': use all (the default), check, time [NAME PART], energy [NAME PART] or "
                 "waves\n", what.c_str());
    return 2;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, sm_%d%d; kernel: %s\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor,
              trainerd::kernels::HopperGemmBuild().c_str());
  constexpr HopperEpilogue kPlain = HopperEpilogue::kPlain, kSwiGlu = HopperEpilogue::kSwiGlu,
                           kBackward = HopperEpilogue::kSwiGluBackward, kRope = HopperEpilogue::kRope;
  bool ok = true;
  if (what == "all" || what == "check") {
    // Tails in every dimension (M, N not tile multiples; K not a k-slice
    // multiple), several tiles a block, and the engine's K with its LoRA
    // columns (4096 + 32) and A rows (4096 + 16).
    const Case checks[] = {
        {"plain", kPlain, false, 256, 256, 64},          {"plain", kPlain, false, 1000, 1000, 1000},
        {"plain", kPlain, false, 129, 264, 4096},        {"plain", kPlain, false, 2048, 6144, 4128},
        {"W transposed", kPlain, true, 256, 256, 64},    {"W transposed", kPlain, true, 1000, 1000, 1000},
        {"W transposed", kPlain, true, 129, 264, 4096},  {"W transposed", kPlain, true, 2048, 3584, 1040},
        {"W transposed", kPlain, true, 2048, 4128, 6144}, {"swiglu", kSwiGlu, false, 256, 512, 128},
        {"swiglu", kSwiGlu, false, 1000, 2 * 520, 1000}, {"swiglu", kSwiGlu, false, 2048, 2 * 3584, 4128},
        {"swiglu, down's LoRA", kSwiGlu, false, 1000, 2 * 520, 1000, 0, true},
        {"swiglu, down's LoRA", kSwiGlu, false, 2048, 2 * 3584, 4128, 0, true},
        {"swiglu backward", kBackward, true, 256, 256, 64}, {"swiglu backward", kBackward, true, 1000, 1000, 1000},
        {"swiglu backward", kBackward, true, 129, 264, 4096}, {"swiglu backward", kBackward, true, 2048, 3584, 1040},
        // Rotary: rows past 2048 (positions wrap), a row tail, a rotated
        // region ending inside a tile (a head of q|k then one of v), none of v.
        {"rope", kRope, false, 2100, 768, 4128, 640}, {"rope", kRope, false, 300, 384, 256, 384},
    };
    for (const Case& c : checks) ok = Check(c) && ok;
  }
  const bool energy = what == "energy";
  Nvml nvml;
  if (energy && !nvml.ok()) {
    std::fprintf(stderr, "energy: NVML (libnvidia-ml.so.1) not available\n");
    return 1;
  }
  if (what == "all" || what == "time" || energy) {
    // The 8b row's shapes (4 x 2048 tokens; LoRA r 16 widening the forward's
    // K by 32 and the backward's by 16).
    const Case timings[] = {
        {"q|k|v", kPlain, false, 8192, 6144, 4128},
        {"q|k|v with rotary", kRope, false, 8192, 6144, 4128, 5120},
        {"gate|up", kPlain, false, 8192, 28672, 4128},
        {"gate|up with SwiGLU", kSwiGlu, false, 8192, 28672, 4128},
        {"gate|up with SwiGLU and down's LoRA product", kSwiGlu, false, 8192, 28672, 4128, 0, true},
        {"down", kPlain, false, 8192, 4096, 14352},
        {"dx of q|k|v (W^T)", kPlain, true, 8192, 4128, 6144},
        {"dx of gate|up (W^T)", kPlain, true, 8192, 4128, 28672},
        {"dh of down (W^T)", kPlain, true, 8192, 14336, 4112},
        {"dh of down with SwiGLU backward (W^T)", kBackward, true, 8192, 14336, 4112},
        {"dh of down with SwiGLU backward and LoRA's sums (W^T)", kBackward, true, 8192, 14336, 4112, 0, true},
        {"square 8192", kPlain, false, 8192, 8192, 8192},
    };
    // NAME PART: the case of that name if there is one, else every case whose name holds it.
    const bool exact =
        std::any_of(std::begin(timings), std::end(timings), [&](const Case& c) { return only == c.name; });
    for (const Case& c : timings) {
      if (!only.empty() && (exact ? only != c.name : std::string(c.name).find(only) == std::string::npos)) continue;
      if (energy) {
        Energy(c, nvml);
      } else {
        Time(c);
      }
    }
  }
  if (what == "waves") {
    // The last round's cost: q|k|v's product (8192 x N x 4128) at N of 20-26
    // column tiles, 1,280-1,664 tiles of 128 x 256 on 132 SMs (9.7-12.6
    // rounds of one tile a block). Measured on an H100: time in steps of whole
    // rounds, a part-filled last round costing a whole one (bench/speed/
    // NOTES.md, "The last round of tiles, and the last k-slice").
    for (int tiles_n = 20; tiles_n <= 26; ++tiles_n) {
      Time(Case{"waves", kPlain, false, 8192, 256 * tiles_n, 4128});
    }
  }
  std::printf("%s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
  return ok ? 0 : 1;
}
