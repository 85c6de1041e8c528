// Checks and times the Hopper attention kernel (engine/kernels/hopper_attention.cu)
// on the GPU machine. From the repository root:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/hopper_attention
//     bench/attention/hopper_attention.cu engine/kernels/hopper_attention.cu -ldl
// (or the CMake build's hopper_attention_bench, built wherever nvcc is)
//   /tmp/hopper_attention            # every check, then every timing
//   /tmp/hopper_attention check | time [NAME PART]
//
// check: the kernel's O and log-sum-exp against a float32 reference computed
// from the same bf16 inputs (a plain kernel: one block a query row, the
// softmax over all of the row's keys at once), on the 8b row's shape and on
// shapes with tails (a sequence not a multiple of 128, one kv head, no
// grouping) and peaky scores (the online softmax's rescaling). An element
// fails when |ours - reference| > 1e-2 (1 + |reference|) (O is rounded to
// bf16: 2^-9 relative, and P to bf16 inside the product); the log-sum-exp
// when off by more than 1e-3 (1 + |reference|).
// time: milliseconds a launch and TFLOP/s by the bench's formula (a causal
// forward 2 b h s^2 d, bench/speed/NOTES.md), after a warm-up.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda_check.h"
#include "engine/kernels/hopper_attention.h"

namespace {

constexpr int kD = 128;

struct Case {
  const char* name;
  int batch, seq, heads, kv_heads;
  float amplitude;  // inputs uniform in [-amplitude, amplitude]
};

// The q|k|v product's layout (hopper_attention.h): a row a token, q's heads,
// then k's, then v's, 128 columns each.
struct Problem {
  Case c;
  int64_t stride() const { return static_cast<int64_t>(c.heads + 2 * c.kv_heads) * kD; }
  int64_t rows() const { return static_cast<int64_t>(c.batch) * c.seq; }
};

// One block of 128 threads a (sequence, head, query row): scores of every key
// up to the row in shared memory, their softmax, then O's 128 columns one a
// thread. Float32 throughout from the bf16 inputs.
__global__ void Reference(const __nv_bfloat16* qkv, int64_t stride, int seq, int heads, int kv_heads, float scale,
                          float* o, float* lse) {
  extern __shared__ float scores[];  // seq floats
  __shared__ float q[kD];
  __shared__ float reduce[128];
  const int row = blockIdx.x % seq, head = (blockIdx.x / seq) % heads, b = blockIdx.x / seq / heads;
  const int kv = head / (heads / kv_heads);
  const int64_t token = static_cast<int64_t>(b) * seq;
  const __nv_bfloat16* k = qkv + static_cast<int64_t>(heads) * kD + kv * kD;
  const __nv_bfloat16* v = k + static_cast<int64_t>(kv_heads) * kD;
  q[threadIdx.x] = __bfloat162float(qkv[(token + row) * stride + head * kD + threadIdx.x]);
  __syncthreads();
  float m = -INFINITY;
  for (int j = threadIdx.x; j <= row; j += blockDim.x) {
    float dot = 0.f;
    for (int d = 0; d < kD; ++d) dot += q[d] * __bfloat162float(k[(token + j) * stride + d]);
    scores[j] = dot * scale;
    m = fmaxf(m, scores[j]);
  }
  reduce[threadIdx.x] = m;
  __syncthreads();
  for (int s = 64; s > 0; s /= 2) {
    if (threadIdx.x < s) reduce[threadIdx.x] = fmaxf(reduce[threadIdx.x], reduce[threadIdx.x + s]);
    __syncthreads();
  }
  m = reduce[0];
  __syncthreads();
  float sum = 0.f;
  for (int j = threadIdx.x; j <= row; j += blockDim.x) {
    scores[j] = expf(scores[j] - m);
    sum += scores[j];
  }
  reduce[threadIdx.x] = sum;
  __syncthreads();
  for (int s = 64; s > 0; s /= 2) {
    if (threadIdx.x < s) reduce[threadIdx.x] += reduce[threadIdx.x + s];
    __syncthreads();
  }
  sum = reduce[0];
  float acc = 0.f;
  for (int j = 0; j <= row; ++j) acc += scores[j] * __bfloat162float(v[(token + j) * stride + threadIdx.x]);
  o[(token + row) * heads * kD + head * kD + threadIdx.x] = acc / sum;
  if (threadIdx.x == 0) lse[(static_cast<int64_t>(b) * heads + head) * seq + row] = m + logf(sum);
}

struct Buffers {
  __nv_bfloat16* qkv = nullptr;
  __nv_bfloat16* o = nullptr;
  float* lse = nullptr;
};

Buffers Make(const Problem& p, uint32_t seed) {
  Buffers b;
  std::vector<__nv_bfloat16> host(p.rows() * p.stride());
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> uniform(-p.c.amplitude, p.c.amplitude);
  for (auto& x : host) x = __float2bfloat16(uniform(gen));
  CHECK_CUDA(cudaMalloc(&b.qkv, host.size() * 2));
  CHECK_CUDA(cudaMemcpy(b.qkv, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&b.o, p.rows() * p.c.heads * kD * 2));
  CHECK_CUDA(cudaMalloc(&b.lse, p.rows() * p.c.heads * 4));
  return b;
}

void Free(Buffers& b) {
  cudaFree(b.qkv);
  cudaFree(b.o);
  cudaFree(b.lse);
}

trainerd::kernels::HopperAttentionOperands Operands(const Problem& p, const Buffers& b) {
  trainerd::kernels::HopperAttentionOperands a;
  a.q = b.qkv;
  a.k = b.qkv + static_cast<int64_t>(p.c.heads) * kD;
  a.v = b.qkv + static_cast<int64_t>(p.c.heads + p.c.kv_heads) * kD;
  a.q_stride = a.k_stride = a.v_stride = p.stride();
  a.o = b.o;
  a.o_stride = static_cast<int64_t>(p.c.heads) * kD;
  a.lse = b.lse;
  a.batch = p.c.batch;
  a.seq = p.c.seq;
  a.heads = p.c.heads;
  a.kv_heads = p.c.kv_heads;
  a.scale = 1.f / std::sqrt(static_cast<float>(kD));
  return a;
}

bool Check(const Case& c) {
  const Problem p{c};
  Buffers b = Make(p, 1234);
  const auto a = Operands(p, b);
  CHECK_CUDA(cudaMemset(b.o, 0xFF, p.rows() * c.heads * kD * 2));  // NaNs where the kernel writes nothing
  const std::string why = trainerd::kernels::HopperAttentionForward(a, nullptr);
  if (!why.empty()) {
    std::printf("%-28s FAILED: %s\n", c.name, why.c_str());
    Free(b);
    return false;
  }
  float *o_ref = nullptr, *lse_ref = nullptr;
  CHECK_CUDA(cudaMalloc(&o_ref, p.rows() * c.heads * kD * 4));
  CHECK_CUDA(cudaMalloc(&lse_ref, p.rows() * c.heads * 4));
  Reference<<<static_cast<unsigned>(p.rows() * c.heads), kD, c.seq * 4>>>(b.qkv, p.stride(), c.seq, c.heads,
                                                                          c.kv_heads, a.scale, o_ref, lse_ref);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<__nv_bfloat16> o(p.rows() * c.heads * kD);
  std::vector<float> o_r(o.size()), lse(p.rows() * c.heads), lse_r(lse.size());
  CHECK_CUDA(cudaMemcpy(o.data(), b.o, o.size() * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(o_r.data(), o_ref, o_r.size() * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(lse.data(), b.lse, lse.size() * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(lse_r.data(), lse_ref, lse_r.size() * 4, cudaMemcpyDeviceToHost));
  cudaFree(o_ref);
  cudaFree(lse_ref);
  Free(b);
  int64_t bad = 0, bad_lse = 0, first_bad = -1;
  double max_err = 0, max_lse_err = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    const double x = __bfloat162float(o[i]), r = o_r[i], err = std::fabs(x - r);
    if (!(err <= 1e-2 * (1 + std::fabs(r)))) {
      if (bad++ == 0) first_bad = static_cast<int64_t>(i);
    }
    if (err > max_err || std::isnan(err)) max_err = std::isnan(err) ? INFINITY : err;
  }
  for (size_t i = 0; i < lse.size(); ++i) {
    const double err = std::fabs(static_cast<double>(lse[i]) - lse_r[i]);
    if (!(err <= 1e-3 * (1 + std::fabs(lse_r[i])))) ++bad_lse;
    if (err > max_lse_err || std::isnan(err)) max_lse_err = std::isnan(err) ? INFINITY : err;
  }
  const bool ok = bad == 0 && bad_lse == 0;
  std::printf("%-28s %s: O max |err| %.3g (%lld of %zu outside), lse max |err| %.3g (%lld outside)", c.name,
              ok ? "passed" : "FAILED", max_err, static_cast<long long>(bad), o.size(), max_lse_err,
              static_cast<long long>(bad_lse));
  if (first_bad >= 0) {
    const int64_t col = first_bad % (c.heads * kD), token = first_bad / (c.heads * kD);
    std::printf("; first at token %lld head %lld column %lld: %g against %g", static_cast<long long>(token),
                static_cast<long long>(col / kD), static_cast<long long>(col % kD),
                __bfloat162float(o[first_bad]), o_r[first_bad]);
  }
  std::printf("\n");
  std::fflush(stdout);
  return ok;
}

void Time(const Case& c) {
  const Problem p{c};
  Buffers b = Make(p, 99);
  const auto a = Operands(p, b);
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 5; ++i) {
    const std::string why = trainerd::kernels::HopperAttentionForward(a, nullptr);
    if (!why.empty()) {
      std::printf("%-28s %s\n", c.name, why.c_str());
      return;
    }
  }
  constexpr int kLaunches = 50;
  CHECK_CUDA(cudaEventRecord(start));
  for (int i = 0; i < kLaunches; ++i) (void)trainerd::kernels::HopperAttentionForward(a, nullptr);
  CHECK_CUDA(cudaEventRecord(stop));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  ms /= kLaunches;
  const double flops = 2.0 * c.batch * c.heads * static_cast<double>(c.seq) * c.seq * kD;
  std::printf("%-28s %.4f ms, %.0f TFLOP/s\n", c.name, ms, flops / ms / 1e9);
  std::fflush(stdout);
  Free(b);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const std::string part = argc > 2 ? argv[2] : "";
  const Case checks[] = {
      {"8b: 4 x 2048, 32 / 8 heads", 4, 2048, 32, 8, 1.f},
      {"peaky: 2 x 1024, 8 / 2", 2, 1024, 8, 2, 4.f},
      {"tails: 3 x 300, 8 / 1", 3, 300, 8, 1, 2.f},
      {"short: 2 x 77, 4 / 4", 2, 77, 4, 4, 2.f},
  };
  const Case timings[] = {
      {"8b: 4 x 2048, 32 / 8 heads", 4, 2048, 32, 8, 1.f},
      {"8b-ckpt: 8 x 2048", 8, 2048, 32, 8, 1.f},
      {"long: 1 x 8192, 32 / 8", 1, 8192, 32, 8, 1.f},
  };
  int failed = 0;
  if (mode.empty() || mode == "check") {
    for (const Case& c : checks) {
      if (std::string(c.name).find(part) != std::string::npos && !Check(c)) ++failed;
    }
    std::printf("check: %d failed\n", failed);
  }
  if (mode.empty() || mode == "time") {
    for (const Case& c : timings) {
      if (std::string(c.name).find(part) != std::string::npos) Time(c);
    }
  }
  return failed == 0 ? 0 : 1;
}
