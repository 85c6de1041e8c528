// Causal attention's forward for Hopper (hopper_attention.h): kernel and
// launcher. Built for sm_90a only, beside the Hopper GEMM (the same
// primitives, hopper_primitives.cuh). bench/attention/hopper_attention.cu
// checks it against a float32 reference and times it.
#include "engine/kernels/hopper_attention.h"
#include "engine/kernels/hopper_primitives.cuh"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <mutex>

namespace trainerd::kernels {
namespace {

using namespace hopper;  // NOLINT(build/namespaces): the shared primitives

constexpr int kHeadDim = 128;
constexpr int kBlockQ = 128;   // query rows a block: 64 a consumer warpgroup
constexpr int kBlockKv = 128;  // keys a tile
constexpr int kStages = 2;     // K and V tiles in flight
constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
// Shared memory: Q (two 64-column boxes of 128 rows, 16 KB each), then each
// stage's K (likewise) and V (four 64 x 64 boxes: key block kb, column block
// db at kb * 16 KB + db * 8 KB, the MN-major layout DescriptorMN reads).
constexpr int kQBytes = kBlockQ * kHeadDim * 2;    // 32 KB
constexpr int kKBytes = kBlockKv * kHeadDim * 2;   // 32 KB
constexpr int kVBytes = kBlockKv * kHeadDim * 2;   // 32 KB
constexpr int kBoxBytes = 128 * 64 * 2;            // a 128-row box of 64 columns: 16 KB
constexpr int kSmemBytes = kQBytes + kStages * (kKBytes + kVBytes) + (2 * kStages + 1) * 8 + 1024;
static_assert(kSmemBytes <= 227 * 1024, "shared memory over the 227 KB a block may have");
// Registers: the producer gives up all but 24 of the launch's 168 a thread;
// the consumers hold S and O (64 floats each) and P (32 registers).
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;
static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= kThreads * (65536 / kThreads / 8 * 8),
              "the warpgroups' registers over the launch's");

#define HA_D64 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// d (64 x 128, this thread's 64 values) = or += A (64 x 16, shared memory,
// K-major) B (128 x 16, shared memory, K-major)^T.
__device__ __forceinline__ void WgmmaSS(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : HA_D64
      : "l"(a), "l"(b), "r"(accumulate));
}

// d (64 x 128) += A (64 x 16 from registers: wgmma's A fragment, four bf16
// pairs a thread) B (16 x 128, shared memory, MN-major).
__device__ __forceinline__ void WgmmaRS(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
      : HA_D64
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

#undef HA_D64

// 2^x by the MUFU instruction (2 ulp; -inf gives 0), as FlashAttention's softmax.
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

struct AttentionMaps {
  CUtensorMap q;  // 3-D (seq, q columns, batch), box 128 rows x 64 columns
  CUtensorMap k;  // likewise over k
  CUtensorMap v;  // box 64 rows x 64 columns
  CUtensorMap o;  // box 64 rows x 64 columns
  float* lse;
  int seq, heads, group, q_tiles, batch;
  float scale_log2;  // scale * log2(e): the softmax in powers of two
};

// The accumulator layout of wgmma m64nN (a warpgroup's 64 rows): warp w,
// lane l holds rows 16 w + l / 4 (values 4 i, 4 i + 1) and + 8 (4 i + 2,
// 4 i + 3), columns 8 i + 2 (l % 4) and + 1 of each group i of 8 columns.
// The same pairs, rounded to bf16, are the A fragment of wgmma's k16 step
// over columns 16 j .. 16 j + 15 (groups 2 j and 2 j + 1).

__global__ void __launch_bounds__(kThreads, 1) ForwardKernel(const __grid_constant__ AttentionMaps maps) {
  extern __shared__ uint8_t raw_smem[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw_smem) + 1023) & ~uintptr_t{1023});
  uint8_t* q_smem = smem;
  uint8_t* k_smem = q_smem + kQBytes;
  uint8_t* v_smem = k_smem + kStages * kKBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(v_smem + kStages * kVBytes);
  uint64_t* empty = full + kStages;
  uint64_t* q_full = empty + kStages;

  // The heaviest blocks (the last query tiles, the most keys) first.
  const int per_tile = maps.batch * maps.heads;
  const int q_tile = maps.q_tiles - 1 - static_cast<int>(blockIdx.x) / per_tile;
  const int batch = static_cast<int>(blockIdx.x) % per_tile / maps.heads;
  const int head = static_cast<int>(blockIdx.x) % maps.heads;
  const int kv_head = head / maps.group;
  const int kv_tiles = q_tile + 1;  // causal: keys up to the tile's last row

  const int warpgroup = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      BarrierInit(&full[s], 1);
      BarrierInit(&empty[s], 2 * 4);  // one arrival per consumer warp
    }
    BarrierInit(q_full, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warpgroup == 0) {
    LowerRegisters<kProducerRegisters>();
    if (tid != 0) return;
    BarrierExpectBytes(q_full, kQBytes);
    for (int db = 0; db < 2; ++db) {
      TmaLoad3(q_smem + db * kBoxBytes, &maps.q, head * kHeadDim + 64 * db, q_tile * kBlockQ, batch, q_full);
    }
    for (int j = 0; j < kv_tiles; ++j) {
      const int s = j % kStages;
      BarrierWait(&empty[s], ((j / kStages) & 1) ^ 1);
      BarrierExpectBytes(&full[s], kKBytes + kVBytes);
      uint8_t* k = k_smem + s * kKBytes;
      uint8_t* v = v_smem + s * kVBytes;
      for (int db = 0; db < 2; ++db) {
        const int col = kv_head * kHeadDim + 64 * db;
        TmaLoad3(k + db * kBoxBytes, &maps.k, col, j * kBlockKv, batch, &full[s]);
        for (int kb = 0; kb < 2; ++kb) {
          TmaLoad3(v + kb * kBoxBytes + db * (kBoxBytes / 2), &maps.v, col, j * kBlockKv + 64 * kb, batch, &full[s]);
        }
      }
    }
    return;
  }

  RaiseRegisters<kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const int warp = tid / 32, lane = tid % 32;
  // This thread's two rows within the block's 128, and within the sequence.
  const int row_in_block = consumer * 64 + 16 * warp + lane / 4;
  const int row0 = q_tile * kBlockQ + row_in_block;
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // of the scaled scores, in log2 units
  float row_sum[2] = {0.f, 0.f};              // this thread's share of sum 2^(s - max)

  BarrierWait(q_full, 0);
  const uint32_t q_address = SmemAddress(q_smem + consumer * (kBoxBytes / 2));
  for (int j = 0; j < kv_tiles; ++j) {
    const int s = j % kStages;
    BarrierWait(&full[s], (j / kStages) & 1);
    const uint32_t k_address = SmemAddress(k_smem + s * kKBytes);
    const uint32_t v_address = SmemAddress(v_smem + s * kVBytes);
    float sc[64];
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t step = (kk / 4) * kBoxBytes + (kk % 4) * 32;
      WgmmaSS(sc, DescriptorK(q_address + step), DescriptorK(k_address + step), kk > 0);
    }
    WgmmaCommit();
    WgmmaWait<0>();

    // Scale (log2 units); on the diagonal tile mask the keys past each row
    // (which covers a last tile's keys past the sequence, TMA's zeros, for
    // every row that is stored; the rows past the sequence are not).
#pragma unroll
    for (int i = 0; i < 64; ++i) sc[i] *= maps.scale_log2;
    if (j == q_tile) {
      const int key0 = j * kBlockKv + 2 * (lane % 4);
#pragma unroll
      for (int i = 0; i < 16; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (key0 + 8 * i + (e & 1) > row0 + 8 * (e >> 1)) sc[4 * i + e] = -INFINITY;
        }
      }
    }
    float correction[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = row_max[r];
#pragma unroll
      for (int i = 0; i < 16; ++i) m = fmaxf(m, fmaxf(sc[4 * i + 2 * r], sc[4 * i + 2 * r + 1]));
      m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
      // Key 0 is every row's, so m is finite from the first tile on.
      correction[r] = Exp2(row_max[r] - m);
      row_max[r] = m;
      row_sum[r] *= correction[r];
    }
    uint32_t p[32];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float a = Exp2(sc[4 * i + 2 * r] - row_max[r]);
        const float b = Exp2(sc[4 * i + 2 * r + 1] - row_max[r]);
        row_sum[r] += a + b;
        p[2 * i + r] = PackBf16(a, b);
        o[4 * i + 2 * r] *= correction[r];
        o[4 * i + 2 * r + 1] *= correction[r];
      }
    }
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBlockKv / 16; ++kk) {
      // Keys 16 kk .. + 15: groups 2 kk (pairs p[4 kk], p[4 kk + 1]) and
      // 2 kk + 1 (p[4 kk + 2], p[4 kk + 3]), rows r and r + 8 each.
      const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
      WgmmaRS(o, a, DescriptorMN(v_address + (kk / 4) * kBoxBytes + (kk % 4) * 2048));
    }
    WgmmaCommit();
    WgmmaWait<0>();
    if (lane == 0) BarrierArrive(&empty[s]);
  }

  // O / l, rounded to bf16 over this warpgroup's own rows of Q (its reads of
  // Q are done), then stored by TMA; the log-sum-exp beside it.
  float inverse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = row_sum[r];
    l += __shfl_xor_sync(0xffffffff, l, 1);
    l += __shfl_xor_sync(0xffffffff, l, 2);
    inverse[r] = 1.f / l;
    const int row = row0 + 8 * r;
    if (lane % 4 == 0 && row < maps.seq) {
      maps.lse[(static_cast<int64_t>(batch) * maps.heads + head) * maps.seq + row] =
          (row_max[r] + log2f(l)) * 0.69314718056f;
    }
  }
  auto scaled = [&](int i, int e) { return o[4 * i + e] * inverse[e >> 1]; };
  for (int db = 0; db < 2; ++db) {
    WriteChunk(q_smem + db * kBoxBytes + consumer * (kBoxBytes / 2), warp, lane, 8 * db, scaled);
  }
  FenceAsyncShared();
  NamedBarrier(1 + consumer, 128);
  if (tid == 0) {
    for (int db = 0; db < 2; ++db) {
      TmaStore3Uncommitted(&maps.o, q_smem + db * kBoxBytes + consumer * (kBoxBytes / 2),
                           head * kHeadDim + 64 * db, q_tile * kBlockQ + consumer * 64, batch);
    }
    TmaStoreCommit();
    TmaStoreWaitAll();
  }
}

bool CurrentDeviceIsHopper() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major == 9 && minor == 0;
}

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool HopperAttentionSuits() { return CurrentDeviceIsHopper(); }

std::string HopperAttentionForward(const HopperAttentionOperands& a, void* stream) {
  if (!CurrentDeviceIsHopper()) return "HopperAttention: the current device is not a Hopper GPU (compute capability 9.0)";
  if (a.batch <= 0 || a.seq <= 0 || a.heads <= 0 || a.kv_heads <= 0 || a.heads % a.kv_heads != 0) {
    return "HopperAttention: batch, seq, heads and kv_heads must be positive, heads a multiple of kv_heads";
  }
  if (a.lse == nullptr || !Aligned(a.q) || !Aligned(a.k) || !Aligned(a.v) || !Aligned(a.o) || a.q_stride % 8 != 0 ||
      a.k_stride % 8 != 0 || a.v_stride % 8 != 0 || a.o_stride % 8 != 0 || a.q_stride < a.heads * kHeadDim ||
      a.k_stride < a.kv_heads * kHeadDim || a.v_stride < a.kv_heads * kHeadDim || a.o_stride < a.heads * kHeadDim) {
    return "HopperAttention: pointers must be 16-byte aligned, row strides multiples of 8 elements of at least "
           "the heads' columns, and lse given";
  }
  const int64_t q_tiles = (a.seq + kBlockQ - 1) / kBlockQ;
  if (q_tiles * a.batch * a.heads >= (int64_t{1} << 31) || a.seq * a.batch >= (int64_t{1} << 31)) {
    return "HopperAttention: too many rows";
  }
  AttentionMaps maps{};
  std::string why = Map(&maps.q, a.q, a.seq, a.heads * kHeadDim, a.q_stride, kBlockQ, a.batch, a.seq * a.q_stride);
  if (why.empty()) {
    why = Map(&maps.k, a.k, a.seq, a.kv_heads * kHeadDim, a.k_stride, kBlockKv, a.batch, a.seq * a.k_stride);
  }
  if (why.empty()) why = Map(&maps.v, a.v, a.seq, a.kv_heads * kHeadDim, a.v_stride, 64, a.batch, a.seq * a.v_stride);
  if (why.empty()) why = Map(&maps.o, a.o, a.seq, a.heads * kHeadDim, a.o_stride, 64, a.batch, a.seq * a.o_stride);
  if (!why.empty()) return "HopperAttention: " + why;
  maps.lse = a.lse;
  maps.seq = static_cast<int>(a.seq);
  maps.heads = static_cast<int>(a.heads);
  maps.group = static_cast<int>(a.heads / a.kv_heads);
  maps.q_tiles = static_cast<int>(q_tiles);
  maps.batch = static_cast<int>(a.batch);
  maps.scale_log2 = a.scale * 1.4426950408889634f;

  static std::once_flag once[64];
  static cudaError_t raised[64];
  int device = 0;
  cudaGetDevice(&device);
  std::call_once(once[device % 64], [&] {
    raised[device % 64] = cudaFuncSetAttribute(ForwardKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  });
  if (raised[device % 64] != cudaSuccess) {
    return std::string("HopperAttention: raising the shared-memory limit failed: ") +
           cudaGetErrorString(raised[device % 64]);
  }
  const int blocks = static_cast<int>(q_tiles * a.batch * a.heads);
  ForwardKernel<<<blocks, kThreads, kSmemBytes, static_cast<cudaStream_t>(stream)>>>(maps);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("HopperAttention: launch failed: ") + cudaGetErrorString(e);
}

}  // namespace trainerd::kernels
