// Checks and times the Hopper attention kernel (engine/kernels/hopper_attention.cu)
// on the GPU machine. From the repository root:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/hopper_attention
//     bench/attention/hopper_attention.cu engine/kernels/hopper_attention.cu -ldl
// (or the CMake build's hopper_attention_bench, built wherever nvcc is)
//   /tmp/hopper_attention            # every check, then every timing
//   /tmp/hopper_attention check | time [NAME PART]
//   /tmp/hopper_attention energy [NAME PART]   # joules a launch at the power cap (NVML;
//     default the 8b shape; ENERGY_SECONDS a case, ENERGY_ROUNDS rounds, 3 and 3 unless
//     set); beside python3 bench/attention/attention_energy.py's cuDNN
// The kernel's compile-time knobs (-D; engine/kernels/hopper_attention.cu)
// build variants: HA_STAGES (the forward's ring of K and V tiles, 2 or 3),
// HA_BACKWARD_STAGES (the backward's ring of Q and dO tiles, 2 or 3), HA_DIAGONAL_SKIP (0: the
// forward computes the diagonal tile's wholly masked quarter too).
//
// check: the forward's O and log-sum-exp against a float32 reference computed
// from the same bf16 inputs (plain kernels: one block a query row, the
// softmax over all of the row's keys at once), then the backward's dq, dk and
// dv from the forward's outputs against the reference's (dk and dv summed
// over the query heads of a group by a block a key), on the 8b row's shape
// (two sequences) and on shapes with tails (a sequence not a multiple of 128,
// one kv head, no grouping, an odd number of (sequence, kv head) groups) and
// peaky scores (the online softmax's rescaling); with the rotary embedding's
// positions given (rope cases), dq and dk against the reference's rotated
// back on the host. An element of O fails when |ours - reference| > 1e-2 (1 +
// |reference|) (O is rounded to bf16: 2^-9 relative, and P to bf16 inside
// the product), the log-sum-exp when off by more than 1e-3 (1 +
// |reference|); a gradient when its Frobenius error exceeds 1e-2 of the
// reference's norm or an element is off by 5e-2 of its largest.
// time: milliseconds a call and TFLOP/s by the bench's formula (a causal
// forward 2 b h s^2 d, the backward 2.5 times that; bench/speed/NOTES.md),
// after a warm-up; the backward's call is all its launches (dO.O with dQ's
// sums zeroed, the main kernel, dQ's conversion).
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
#include "bench/nvml_energy.h"
#include "engine/kernels/hopper_attention.h"

namespace {

constexpr int kD = 128;

struct Case {
  const char* name;
  int batch, seq, heads, kv_heads;
  float amplitude;  // inputs uniform in [-amplitude, amplitude]
  bool rope = false;  // the backward rotates dq and dk back (rope_positions, rope_inv_freq)
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

// The backward's reference, float32 from the same bf16 inputs and the
// reference forward's O and log-sum-exp: D = dO.O a (token, head) ...
__global__ void ReferenceDot(const __nv_bfloat16* grad_o, const float* o, float* dot, int seq, int heads) {
  const int64_t pair = blockIdx.x;  // (token, head)
  __shared__ float partial[kD];
  partial[threadIdx.x] = __bfloat162float(grad_o[pair * kD + threadIdx.x]) * o[pair * kD + threadIdx.x];
  __syncthreads();
  for (int s = kD / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const int64_t token = pair / heads, b = token / seq;
  if (threadIdx.x == 0) dot[(b * heads + pair % heads) * seq + token % seq] = partial[0];
}

// ... dS_j = P_j (dO.v_j - D) of a query row over its keys j (shared), then
// dq = scale sum_j dS_j k_j: a block a (sequence, head, row) ...
__global__ void ReferenceDq(const __nv_bfloat16* qkv, int64_t stride, const __nv_bfloat16* grad_o, int seq, int heads,
                            int kv_heads, float scale, const float* lse, const float* dot, float* dq) {
  extern __shared__ float ds[];  // seq floats
  __shared__ float q[kD], g[kD];
  const int row = blockIdx.x % seq, head = (blockIdx.x / seq) % heads, b = blockIdx.x / seq / heads;
  const int kv = head / (heads / kv_heads);
  const int64_t token = static_cast<int64_t>(b) * seq;
  const __nv_bfloat16* k = qkv + static_cast<int64_t>(heads) * kD + kv * kD;
  const __nv_bfloat16* v = k + static_cast<int64_t>(kv_heads) * kD;
  const int64_t at = (static_cast<int64_t>(b) * heads + head) * seq + row;
  q[threadIdx.x] = __bfloat162float(qkv[(token + row) * stride + head * kD + threadIdx.x]);
  g[threadIdx.x] = __bfloat162float(grad_o[((token + row) * heads + head) * kD + threadIdx.x]);
  __syncthreads();
  for (int j = threadIdx.x; j <= row; j += blockDim.x) {
    float s = 0.f, dp = 0.f;
    for (int d = 0; d < kD; ++d) {
      s += q[d] * __bfloat162float(k[(token + j) * stride + d]);
      dp += g[d] * __bfloat162float(v[(token + j) * stride + d]);
    }
    const float p = expf(s * scale - lse[at]);
    ds[j] = p * (dp - dot[at]);
  }
  __syncthreads();
  float acc = 0.f;
  for (int j = 0; j <= row; ++j) acc += ds[j] * __bfloat162float(k[(token + j) * stride + threadIdx.x]);
  dq[(token + row) * heads * kD + head * kD + threadIdx.x] = acc * scale;
}

// ... and dk_j = scale sum dS q, dv_j = sum P dO over the rows at or after
// key j of every query head of its group: a block a (sequence, kv head, key).
__global__ void ReferenceDkDv(const __nv_bfloat16* qkv, int64_t stride, const __nv_bfloat16* grad_o, int seq,
                             int heads, int kv_heads, float scale, const float* lse, const float* dot, float* dk,
                             float* dv) {
  extern __shared__ float weights[];  // [group][seq] P, then [group][seq] dS
  __shared__ float key[kD], value[kD];
  const int j = blockIdx.x % seq, kv = (blockIdx.x / seq) % kv_heads, b = blockIdx.x / seq / kv_heads;
  const int group = heads / kv_heads;
  const int64_t token = static_cast<int64_t>(b) * seq;
  key[threadIdx.x] = __bfloat162float(qkv[(token + j) * stride + (heads + kv) * kD + threadIdx.x]);
  value[threadIdx.x] = __bfloat162float(qkv[(token + j) * stride + (heads + kv_heads + kv) * kD + threadIdx.x]);
  __syncthreads();
  float* p = weights;
  float* ds = weights + group * seq;
  for (int h = 0; h < group; ++h) {
    const int head = kv * group + h;
    for (int t = j + threadIdx.x; t < seq; t += blockDim.x) {
      const __nv_bfloat16* q = qkv + (token + t) * stride + head * kD;
      const __nv_bfloat16* g = grad_o + ((token + t) * heads + head) * kD;
      float s = 0.f, dp = 0.f;
      for (int d = 0; d < kD; ++d) {
        s += __bfloat162float(q[d]) * key[d];
        dp += __bfloat162float(g[d]) * value[d];
      }
      const int64_t at = (static_cast<int64_t>(b) * heads + head) * seq + t;
      p[h * seq + t] = expf(s * scale - lse[at]);
      ds[h * seq + t] = p[h * seq + t] * (dp - dot[at]);
    }
  }
  __syncthreads();
  float dk_acc = 0.f, dv_acc = 0.f;
  for (int h = 0; h < group; ++h) {
    const int head = kv * group + h;
    for (int t = j; t < seq; ++t) {
      dk_acc += ds[h * seq + t] * __bfloat162float(qkv[(token + t) * stride + head * kD + threadIdx.x]);
      dv_acc += p[h * seq + t] * __bfloat162float(grad_o[((token + t) * heads + head) * kD + threadIdx.x]);
    }
  }
  dk[(token + j) * kv_heads * kD + kv * kD + threadIdx.x] = dk_acc * scale;
  dv[(token + j) * kv_heads * kD + kv * kD + threadIdx.x] = dv_acc;
}

// The forward's inputs and outputs, and the backward's: dO (like O, random),
// dq|dk|dv in one buffer laid out as q|k|v (as the engine's group takes its
// output gradient), the workspace.
struct Buffers {
  __nv_bfloat16* qkv = nullptr;
  __nv_bfloat16* o = nullptr;
  float* lse = nullptr;
  __nv_bfloat16* grad_o = nullptr;
  __nv_bfloat16* grad = nullptr;
  void* workspace = nullptr;
  int64_t* positions = nullptr;  // with Case::rope: token t of sequence b at 3 b + t
  float* inv_freq = nullptr;     // llama3's: 500000^(-i / 64)
};

// The rotary embedding's positions and frequencies of a case (Buffers), on the host.
std::vector<int64_t> Positions(const Problem& p) {
  std::vector<int64_t> positions(p.rows());
  for (int64_t r = 0; r < p.rows(); ++r) positions[r] = 3 * (r / p.c.seq) + r % p.c.seq;
  return positions;
}
std::vector<float> InverseFrequencies() {
  std::vector<float> inv_freq(kD / 2);
  for (int i = 0; i < kD / 2; ++i) inv_freq[i] = std::pow(500000.f, -static_cast<float>(2 * i) / kD);
  return inv_freq;
}

__nv_bfloat16* Random(int64_t count, float amplitude, uint32_t seed) {
  std::vector<__nv_bfloat16> host(count);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> uniform(-amplitude, amplitude);
  for (auto& x : host) x = __float2bfloat16(uniform(gen));
  __nv_bfloat16* device = nullptr;
  CHECK_CUDA(cudaMalloc(&device, count * 2));
  CHECK_CUDA(cudaMemcpy(device, host.data(), count * 2, cudaMemcpyHostToDevice));
  return device;
}

Buffers Make(const Problem& p, uint32_t seed) {
  Buffers b;
  b.qkv = Random(p.rows() * p.stride(), p.c.amplitude, seed);
  b.grad_o = Random(p.rows() * p.c.heads * kD, 1.f, seed + 1);
  CHECK_CUDA(cudaMalloc(&b.o, p.rows() * p.c.heads * kD * 2));
  CHECK_CUDA(cudaMalloc(&b.lse, p.rows() * p.c.heads * 4));
  CHECK_CUDA(cudaMalloc(&b.grad, p.rows() * p.stride() * 2));
  CHECK_CUDA(cudaMalloc(&b.workspace,
                        trainerd::kernels::HopperAttentionWorkspaceBytes(p.c.batch, p.c.seq, p.c.heads)));
  if (p.c.rope) {
    const auto positions = Positions(p);
    const auto inv_freq = InverseFrequencies();
    CHECK_CUDA(cudaMalloc(&b.positions, positions.size() * 8));
    CHECK_CUDA(cudaMalloc(&b.inv_freq, inv_freq.size() * 4));
    CHECK_CUDA(cudaMemcpy(b.positions, positions.data(), positions.size() * 8, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(b.inv_freq, inv_freq.data(), inv_freq.size() * 4, cudaMemcpyHostToDevice));
  }
  return b;
}

void Free(Buffers& b) {
  for (void* x : {static_cast<void*>(b.qkv), static_cast<void*>(b.o), static_cast<void*>(b.lse),
                  static_cast<void*>(b.grad_o), static_cast<void*>(b.grad), b.workspace,
                  static_cast<void*>(b.positions), static_cast<void*>(b.inv_freq)}) {
    cudaFree(x);
  }
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

trainerd::kernels::HopperAttentionGradientOperands GradientOperands(const Problem& p, const Buffers& b) {
  trainerd::kernels::HopperAttentionGradientOperands g;
  g.forward = Operands(p, b);
  g.grad_o = b.grad_o;
  g.grad_o_stride = static_cast<int64_t>(p.c.heads) * kD;
  g.grad_q = b.grad;
  g.grad_k = b.grad + static_cast<int64_t>(p.c.heads) * kD;
  g.grad_v = b.grad + static_cast<int64_t>(p.c.heads + p.c.kv_heads) * kD;
  g.grad_q_stride = g.grad_k_stride = g.grad_v_stride = p.stride();
  g.workspace = b.workspace;
  g.rope_positions = b.positions;
  g.rope_inv_freq = b.inv_freq;
  return g;
}

template <typename T>
std::vector<T> Download(const T* device, int64_t count) {
  std::vector<T> host(count);
  CHECK_CUDA(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

float* DeviceFloats(int64_t count) {
  float* x = nullptr;
  CHECK_CUDA(cudaMalloc(&x, count * 4));
  return x;
}

// The rotary embedding's transpose on a float32 reference gradient (rows,
// heads * 128) in place, rope.cu's formula: cos and sin rounded to bf16.
void RotateBack(std::vector<float>& grad, const std::vector<int64_t>& positions, int heads) {
  const auto inv_freq = InverseFrequencies();
  for (size_t r = 0; r < positions.size(); ++r) {
    for (int i = 0; i < kD / 2; ++i) {
      const float f = static_cast<float>(positions[r]) * inv_freq[i];
      const float c = __bfloat162float(__float2bfloat16(std::cos(f)));
      const float s = __bfloat162float(__float2bfloat16(std::sin(f)));
      for (int h = 0; h < heads; ++h) {
        float& a = grad[(r * heads + h) * kD + i];
        float& b = grad[(r * heads + h) * kD + i + kD / 2];
        const float ra = a * c + b * s;
        b = b * c - a * s;
        a = ra;
      }
    }
  }
}

// Columns col0 .. col0 + cols of a bf16 matrix (rows `stride` apart) against
// a dense float32 (rows, cols) reference: a gradient passes when its
// Frobenius error is within 1e-2 of the reference's norm and no element is
// off by more than 5e-2 of the reference's largest (bf16 operands and
// results, float32 sums).
bool CompareGradient(const char* what, const std::vector<__nv_bfloat16>& ours, int64_t col0, int64_t stride,
                     const std::vector<float>& ref, int64_t rows, int64_t cols) {
  double err2 = 0, ref2 = 0, max_err = 0, max_ref = 0;
  int64_t worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double x = __bfloat162float(ours[r * stride + col0 + c]), y = ref[r * cols + c];
      const double e = std::isnan(x) ? INFINITY : std::fabs(x - y);
      err2 += e * e;
      ref2 += y * y;
      if (e > max_err) {
        max_err = e;
        worst = r * cols + c;
      }
      max_ref = std::max(max_ref, std::fabs(y));
    }
  }
  const double relative = std::sqrt(err2 / std::max(ref2, 1e-30));
  const bool ok = relative <= 1e-2 && max_err <= 5e-2 * max_ref;
  std::printf(" %s %s (relative %.2g, max |err| %.2g of %.2g", what, ok ? "ok" : "FAILED", relative, max_err,
              max_ref);
  if (!ok) {
    // Where: token (row), column; the head is column / 128.
    std::printf(", worst at token %lld column %lld: %g against %g", static_cast<long long>(worst / cols),
                static_cast<long long>(worst % cols),
                __bfloat162float(ours[(worst / cols) * stride + col0 + worst % cols]), ref[worst]);
  }
  std::printf(")");
  return ok;
}

// The forward's O and log-sum-exp against the reference (element by
// element), then the backward's dq, dk and dv from the forward's outputs
// (as training runs them) against the reference's.
bool Check(const Case& c) {
  const Problem p{c};
  Buffers b = Make(p, 1234);
  const auto a = Operands(p, b);
  const int64_t o_count = p.rows() * c.heads * kD;
  CHECK_CUDA(cudaMemset(b.o, 0xFF, o_count * 2));  // NaNs where the kernel writes nothing
  CHECK_CUDA(cudaMemset(b.grad, 0xFF, p.rows() * p.stride() * 2));
  std::string why = trainerd::kernels::HopperAttentionForward(a, nullptr);
  if (why.empty()) why = trainerd::kernels::HopperAttentionBackward(GradientOperands(p, b), nullptr);
  if (!why.empty()) {
    std::printf("%-28s FAILED: %s\n", c.name, why.c_str());
    Free(b);
    return false;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  float* o_ref = DeviceFloats(o_count);
  float* lse_ref = DeviceFloats(p.rows() * c.heads);
  float* dot_ref = DeviceFloats(p.rows() * c.heads);
  float* dq_ref = DeviceFloats(o_count);
  float* dk_ref = DeviceFloats(p.rows() * c.kv_heads * kD);
  float* dv_ref = DeviceFloats(p.rows() * c.kv_heads * kD);
  const unsigned rows = static_cast<unsigned>(p.rows() * c.heads);
  Reference<<<rows, kD, c.seq * 4>>>(b.qkv, p.stride(), c.seq, c.heads, c.kv_heads, a.scale, o_ref, lse_ref);
  ReferenceDot<<<rows, kD>>>(b.grad_o, o_ref, dot_ref, c.seq, c.heads);
  ReferenceDq<<<rows, kD, c.seq * 4>>>(b.qkv, p.stride(), b.grad_o, c.seq, c.heads, c.kv_heads, a.scale, lse_ref,
                                       dot_ref, dq_ref);
  const int weights_bytes = 2 * (c.heads / c.kv_heads) * c.seq * 4;
  CHECK_CUDA(cudaFuncSetAttribute(ReferenceDkDv, cudaFuncAttributeMaxDynamicSharedMemorySize, weights_bytes));
  ReferenceDkDv<<<static_cast<unsigned>(p.rows() * c.kv_heads), kD, weights_bytes>>>(
      b.qkv, p.stride(), b.grad_o, c.seq, c.heads, c.kv_heads, a.scale, lse_ref, dot_ref, dk_ref, dv_ref);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  const auto o = Download(b.o, o_count);
  const auto o_r = Download(o_ref, o_count);
  const auto lse = Download(b.lse, p.rows() * c.heads);
  const auto lse_r = Download(lse_ref, p.rows() * c.heads);
  const auto grad = Download(b.grad, p.rows() * p.stride());
  auto dq_r = Download(dq_ref, o_count);
  auto dk_r = Download(dk_ref, p.rows() * c.kv_heads * kD);
  if (c.rope) {
    RotateBack(dq_r, Positions(p), c.heads);
    RotateBack(dk_r, Positions(p), c.kv_heads);
  }
  const auto dv_r = Download(dv_ref, p.rows() * c.kv_heads * kD);
  for (float* x : {o_ref, lse_ref, dot_ref, dq_ref, dk_ref, dv_ref}) cudaFree(x);
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
  const bool forward_ok = bad == 0 && bad_lse == 0;
  std::printf("%-28s forward %s: O max |err| %.3g (%lld of %zu outside), lse max |err| %.3g (%lld outside)", c.name,
              forward_ok ? "passed" : "FAILED", max_err, static_cast<long long>(bad), o.size(), max_lse_err,
              static_cast<long long>(bad_lse));
  if (first_bad >= 0) {
    const int64_t col = first_bad % (c.heads * kD), token = first_bad / (c.heads * kD);
    std::printf("; first at token %lld head %lld column %lld: %g against %g", static_cast<long long>(token),
                static_cast<long long>(col / kD), static_cast<long long>(col % kD),
                __bfloat162float(o[first_bad]), o_r[first_bad]);
  }
  std::printf("\n%-28s backward:", "");
  bool backward_ok = CompareGradient("dq", grad, 0, p.stride(), dq_r, p.rows(), c.heads * kD);
  backward_ok &= CompareGradient("dk", grad, c.heads * kD, p.stride(), dk_r, p.rows(), c.kv_heads * kD);
  backward_ok &= CompareGradient("dv", grad, (c.heads + c.kv_heads) * kD, p.stride(), dv_r, p.rows(),
                                 c.kv_heads * kD);
  std::printf("\n");
  std::fflush(stdout);
  return forward_ok && backward_ok;
}

// Milliseconds a call of `launch` (after a warm-up), or -1 when it failed.
template <typename Launch>
float Milliseconds(Launch launch) {
  for (int i = 0; i < 5; ++i) {
    const std::string why = launch();
    if (!why.empty()) {
      std::printf("  %s\n", why.c_str());
      return -1;
    }
  }
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  constexpr int kLaunches = 50;
  CHECK_CUDA(cudaEventRecord(start));
  for (int i = 0; i < kLaunches; ++i) (void)launch();
  CHECK_CUDA(cudaEventRecord(stop));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / kLaunches;
}

void Time(const Case& c) {
  const Problem p{c};
  Buffers b = Make(p, 99);
  const auto a = Operands(p, b);
  const auto g = GradientOperands(p, b);
  const float forward = Milliseconds([&] { return trainerd::kernels::HopperAttentionForward(a, nullptr); });
  const float backward = Milliseconds([&] { return trainerd::kernels::HopperAttentionBackward(g, nullptr); });
  const double flops = 2.0 * c.batch * c.heads * static_cast<double>(c.seq) * c.seq * kD;
  std::printf("%-28s forward %.4f ms, %.0f TFLOP/s; backward (all its launches) %.4f ms, %.0f TFLOP/s\n",
              c.name, forward, flops / forward / 1e9, backward, 2.5 * flops / backward / 1e9);
  std::fflush(stdout);
  Free(b);
}

}  // namespace

// Forward, backward and both back to back for a few seconds each (as a
// training step runs them, at the card's power cap), over rounds so that
// drift shows: milliseconds, joules, power and clock a launch, in
// attention_energy.py's format (whose cuDNN lines, from the same start, they
// compare with: at the cap the joules a layer set the step's time).
void Energy(const Case& c, const Nvml& nvml) {
  const Problem p{c};
  Buffers b = Make(p, 99);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  const auto a = Operands(p, b);
  const auto g = GradientOperands(p, b);
  const auto forward = [&] { return trainerd::kernels::HopperAttentionForward(a, stream); };
  const auto backward = [&] { return trainerd::kernels::HopperAttentionBackward(g, stream); };
  std::string why = forward();
  if (why.empty()) why = backward();
  if (!why.empty()) {
    std::printf("energy %s: %s\n", c.name, why.c_str());
  } else {
    const double flops = 2.0 * c.batch * c.heads * static_cast<double>(c.seq) * c.seq * kD;
    const struct {
      const char* name;
      double flops;
      int which;  // 1 forward, 2 backward, 3 both
    } sides[] = {
        {"ours forward", flops, 1}, {"ours backward", 2.5 * flops, 2}, {"ours forward+backward", 3.5 * flops, 3}};
    // ENERGY_SECONDS (default 3) a case, ENERGY_ROUNDS (default 3) rounds.
    const char* seconds_env = std::getenv("ENERGY_SECONDS");
    const char* rounds_env = std::getenv("ENERGY_ROUNDS");
    const double seconds = seconds_env != nullptr ? std::max(0.1, std::atof(seconds_env)) : 3.0;
    const int rounds = rounds_env != nullptr ? std::max(1, std::atoi(rounds_env)) : 3;
    std::printf("energy %s: %.1f s a case, %d rounds\n", c.name, seconds, rounds);
    for (int round = 0; round < rounds; ++round) {
      for (const auto& side : sides) {
        const EnergyReading r = BackToBack(nvml, stream, seconds, [&] {
          if (side.which & 1) (void)forward();
          if (side.which & 2) (void)backward();
        });
        std::printf("round %d  %-26s %8.3f ms %8.4f J %5.0f W %5.0f MHz %6.0f TFLOP/s %6.3f J/PFLOP (%ld calls)\n",
                    round, side.name, r.ms, r.joules, r.watts, r.mhz, side.flops / r.ms / 1e9,
                    r.joules / side.flops * 1e15, r.launches);
      }
    }
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  Free(b);
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const std::string part = argc > 2 ? argv[2] : "";
  const Case checks[] = {
      {"8b: 2 x 2048, 32 / 8 heads", 2, 2048, 32, 8, 1.f},
      {"peaky: 2 x 1024, 8 / 2", 2, 1024, 8, 2, 4.f},
      {"tails: 3 x 300, 8 / 1", 3, 300, 8, 1, 2.f},
      {"short: 2 x 77, 4 / 4", 2, 77, 4, 4, 2.f},
      {"odd groups: 1 x 512, 4 / 1", 1, 512, 4, 1, 2.f},
      {"rope: 2 x 300, 8 / 2", 2, 300, 8, 2, 2.f, true},
      {"8b rope: 1 x 2048, 32 / 8", 1, 2048, 32, 8, 1.f, true},
  };
  const Case timings[] = {
      {"8b: 4 x 2048, 32 / 8 heads", 4, 2048, 32, 8, 1.f},
      {"8b rope: 4 x 2048", 4, 2048, 32, 8, 1.f, true},
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
  if (mode == "energy") {
    const Nvml nvml;
    if (!nvml.ok()) {
      std::fprintf(stderr, "energy: NVML (libnvidia-ml.so.1) not available\n");
      return 1;
    }
    // The 8b shape unless a part of a name is given.
    for (const Case& c : timings) {
      if (std::string(c.name).find(part.empty() ? "8b:" : part) != std::string::npos) Energy(c, nvml);
    }
  }
  return failed == 0 ? 0 : 1;
}
