// Causal attention's forward for Hopper (hopper_attention.h): kernel and
// launcher. Built for sm_90a only, beside the Hopper GEMM (the same
// primitives, hopper_primitives.cuh). bench/attention/hopper_attention.cu
// checks it against a float32 reference and times it.
#include "engine/kernels/hopper_attention.h"
#include "engine/kernels/hopper_attention_schedule.h"
#include "engine/kernels/hopper_primitives.cuh"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#ifndef HA_BACKWARD_STAGES
#define HA_BACKWARD_STAGES 2  // the backward's ring of Q and dO tiles (3 fits: 194 KB)
#endif
#ifndef HA_STAGES
#define HA_STAGES 2  // the forward's ring of K and V tiles (3 fits: 225 KB of shared memory)
#endif
#ifndef HA_DIAGONAL_SKIP
#define HA_DIAGONAL_SKIP 1  // 0: the diagonal's wholly masked quarter computed as the rest (for comparison)
#endif

namespace trainerd::kernels {
namespace {

using namespace hopper;  // NOLINT(build/namespaces): the shared primitives

constexpr int kHeadDim = 128;
constexpr int kBlockQ = 128;   // query rows a block: 64 a consumer warpgroup
constexpr int kBlockKv = 128;  // keys a tile
constexpr int kStages = HA_STAGES;  // K and V tiles in flight
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
// Registers: the producer gives up most of the launch's 168 a thread to the
// consumers (setmaxnreg moves them within the block: the split may not
// exceed the launch's). The forward's consumers hold S and O (64 floats each)
// and P (32 registers); the backward's dK and dV (64 each), S^T and dP^T (32
// each), and its producer a warp of row loads besides the TMA thread (at 24
// it spills; at 32, 8 bytes of the consumers' spill, measured by ptxas -v).
constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;
constexpr int kBackwardProducerRegisters = 32, kBackwardConsumerRegisters = 232;
static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= kThreads * kLaunchRegisters &&
                  128 * kBackwardProducerRegisters + 256 * kBackwardConsumerRegisters <= kThreads * kLaunchRegisters,
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

// d (64 x 64, this thread's 32 values) = or += A (64 x 16) B (64 x 16)^T,
// both in shared memory; A MN-major when kTransposeA, B when kTransposeB.
template <int kTransposeA, int kTransposeB>
__device__ __forceinline__ void WgmmaSS64(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, %35, %36;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate), "n"(kTransposeA), "n"(kTransposeB));
}

// 2^x by the MUFU instruction (2 ulp; -inf gives 0), as FlashAttention's softmax.
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 2^x by the MUFU instruction and the softmax in powers of two: log2(e), ln(2).
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.69314718056f;

// The sequences' shape, as both kernels take it.
struct SequenceShape {
  int seq, heads, group, kv_heads, batch;  // group: query heads a kv head
  float scale, scale_log2;                 // the scores' scale, and scale * log2(e)
};

struct AttentionMaps {
  CUtensorMap q;  // 3-D (seq, q columns, batch), box 128 rows x 64 columns
  CUtensorMap k;  // likewise over k
  CUtensorMap v;  // box 64 rows x 64 columns
  CUtensorMap o;  // box 64 rows x 64 columns
  float* lse;
  SequenceShape shape;
  int q_tiles;
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
  const int per_tile = maps.shape.batch * maps.shape.heads;
  const int q_tile = maps.q_tiles - 1 - static_cast<int>(blockIdx.x) / per_tile;
  const int batch = static_cast<int>(blockIdx.x) % per_tile / maps.shape.heads;
  const int head = static_cast<int>(blockIdx.x) % maps.shape.heads;
  const int kv_head = head / maps.shape.group;
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
  // S = Q K_j^T into sc (issued and committed, not waited for), over the
  // tile's first kKeySteps * 16 keys: all 128, or 64 into sc[0..31] (groups
  // 0-7; the rest neither written here nor read by softmax).
  auto issue_scores = [&](float (&sc)[64], int j, auto key_steps) {
    constexpr int kKeySteps = decltype(key_steps)::value;
    const uint32_t k_address = SmemAddress(k_smem + (j % kStages) * kKBytes);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t step = (kk / 4) * kBoxBytes + (kk % 4) * 32;
      if constexpr (kKeySteps == kBlockKv / 16) {
        WgmmaSS(sc, DescriptorK(q_address + step), DescriptorK(k_address + step), kk > 0);
      } else {
        static_assert(kKeySteps == kBlockKv / 32, "a whole tile or its first 64 keys");
        WgmmaSS64<0, 0>(*reinterpret_cast<float(*)[32]>(&sc[0]), DescriptorK(q_address + step),
                        DescriptorK(k_address + step), kk > 0);
      }
    }
    WgmmaCommit();
  };
  // The online softmax of tile j's scores (scaled to log2 units inside the
  // exponent's FMA; the maxima kept in those units), the keys past each row
  // masked on the diagonal tile (which covers a last tile's keys past the
  // sequence, TMA's zeros, for every row that is stored; the rows past the
  // sequence are not); the rows' new maxima and sums, P in bf16 pairs
  // (p[2 i + r]: group i, row half r) and the factor O must be scaled by;
  // over the groups of the tile's first key_steps * 16 keys (the rest of sc
  // and p neither read nor written).
  auto softmax = [&](float (&sc)[64], int j, uint32_t (&p)[32], float (&correction)[2], auto key_steps) {
    constexpr int kGroups = 2 * decltype(key_steps)::value;
    if (j == q_tile) {
      const int key0 = j * kBlockKv + 2 * (lane % 4);
#pragma unroll
      for (int i = 0; i < kGroups; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (key0 + 8 * i + (e & 1) > row0 + 8 * (e >> 1)) sc[4 * i + e] = -INFINITY;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // The maximum of the raw scores, scaled once (the scale is positive).
      float m = -INFINITY;
#pragma unroll
      for (int i = 0; i < kGroups; ++i) m = fmaxf(m, fmaxf(sc[4 * i + 2 * r], sc[4 * i + 2 * r + 1]));
      m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
      // Key 0 is every row's, so the maximum is finite from the first tile on.
      m = fmaxf(row_max[r], m * maps.shape.scale_log2);
      correction[r] = Exp2(row_max[r] - m);
      row_max[r] = m;
      row_sum[r] *= correction[r];
    }
    // 2^(scale_log2 s - max): one FMA an element (masked: -inf, so 0).
#pragma unroll
    for (int i = 0; i < kGroups; ++i) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float a = Exp2(fmaf(sc[4 * i + 2 * r], maps.shape.scale_log2, -row_max[r]));
        const float b = Exp2(fmaf(sc[4 * i + 2 * r + 1], maps.shape.scale_log2, -row_max[r]));
        row_sum[r] += a + b;
        p[2 * i + r] = PackBf16(a, b);
      }
    }
  };
  auto rescale = [&](const float (&correction)[2]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] *= correction[(i >> 1) & 1];
  };
  // O += P V_j (issued and committed, not waited for) over the tile's first
  // kKeySteps * 16 keys (P is 0 past them). Keys 16 kk .. + 15 are groups
  // 2 kk (pairs p[4 kk], p[4 kk + 1]) and 2 kk + 1 (p[4 kk + 2], p[4 kk + 3]),
  // rows r and r + 8 each: wgmma's A fragment.
  auto issue_values = [&](const uint32_t (&p)[32], int j, auto key_steps) {
    const uint32_t v_address = SmemAddress(v_smem + (j % kStages) * kVBytes);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < decltype(key_steps)::value; ++kk) {
      const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
      WgmmaRS(o, a, DescriptorMN(v_address + (kk / 4) * kBoxBytes + (kk % 4) * 2048));
    }
    WgmmaCommit();
  };
  auto release = [&](int j) {
    if (lane == 0) BarrierArrive(&empty[j % kStages]);
  };
  auto wait_tile = [&](int j) { BarrierWait(&full[j % kStages], (j / kStages) & 1); };

  auto tile = [&](int j, auto key_steps) {
    float sc[64], correction[2];
    uint32_t p[32];
    wait_tile(j);
    issue_scores(sc, j, key_steps);
    WgmmaWait<0>();
    softmax(sc, j, p, correction, key_steps);
    rescale(correction);
    issue_values(p, j, key_steps);
    WgmmaWait<0>();
    release(j);
  };
  using WholeTile = std::integral_constant<int, kBlockKv / 16>;
  using FirstHalf = std::integral_constant<int, kBlockKv / 32>;
  // Consumer 0's rows end before keys 64-127 of the diagonal tile (the last)
  // begin: that quarter is wholly masked and its products are skipped. That
  // saves the tensor cores' energy, which the power cap charges, and some of
  // the block's time (measured: bench/speed/NOTES.md, "The diagonal's masked
  // quarter"). The diagonal tile is peeled off the loop rather than chosen
  // inside it: a branch around the products would have ptxas fence them
  // (C7519/C7520).
  for (int j = 0; j < kv_tiles - 1; ++j) tile(j, WholeTile());
  if (HA_DIAGONAL_SKIP && consumer == 0) {
    tile(kv_tiles - 1, FirstHalf());
  } else {
    tile(kv_tiles - 1, WholeTile());
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
    if (lane % 4 == 0 && row < maps.shape.seq) {
      maps.lse[(static_cast<int64_t>(batch) * maps.shape.heads + head) * maps.shape.seq + row] =
          (row_max[r] + log2f(l)) * kLn2;
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

// ---- the backward ----

constexpr int kBackwardQ = 64;  // query rows a step
constexpr int kBackwardStages = HA_BACKWARD_STAGES;  // Q and dO tiles in flight
constexpr int kQ64Bytes = kBackwardQ * kHeadDim * 2;  // 16 KB: a 64-row tile of Q or dO (two 8 KB boxes)
constexpr int kChunk = 64 * 64 * 2;                  // 8 KB: 64 rows x 64 columns, bf16
constexpr int kDsBytes = kBlockKv * kBackwardQ * 2;  // 16 KB: dS^T of a step, keys x queries
constexpr int kDqTileFloats = kBackwardQ * kHeadDim;  // a step's dQ sums: 8,192 floats
constexpr int kRowBytes = kBackwardStages * 2 * kBackwardQ * 4;  // each stage's 64 log-sum-exps and D values: 1 KB
// K and V (32 KB each), the stages of Q and dO, dS^T twice, the stages'
// log-sum-exps and D values, barriers.
constexpr int kBackwardSmemBytes =
    2 * kKBytes + kBackwardStages * 2 * kQ64Bytes + 2 * kDsBytes + kRowBytes + (2 * kBackwardStages + 2) * 8 + 1024;
static_assert(kBackwardSmemBytes <= 227 * 1024, "shared memory over the 227 KB a block may have");

struct BackwardMaps {
  CUtensorMap q;       // box 64 rows x 64 columns
  CUtensorMap k;       // box 128 rows
  CUtensorMap v;       // box 128 rows
  CUtensorMap grad_o;  // box 64 rows
  CUtensorMap grad_k;  // box 64 rows
  CUtensorMap grad_v;  // box 64 rows
  const float* lse;    // (batch, heads, seq)
  const float* dot;    // (batch, heads, seq): dO.O
  float* dq_sums;      // (batch, heads, q64 tiles, 2 halves of 64 columns, 64 x 64 in DqHalfOffset's order)
  const int64_t* rope_positions;  // null, or dK rotated back (HopperAttentionGradientOperands)
  const float* rope_inv_freq;
  SequenceShape shape;
  int q64_tiles;
};

// D = dO.O for each (token, head): 16 lanes a pair (two a warp), eight
// elements (16 bytes of each operand) a lane. The same launch zeroes dQ's
// float32 sums (zero_vectors float4s from zero), spread evenly over its
// threads: a launch fewer than a memset before it, the same bytes.
__global__ void DotKernel(const __nv_bfloat16* __restrict__ grad_o, int64_t grad_o_stride,
                          const __nv_bfloat16* __restrict__ o, int64_t o_stride, float* __restrict__ dot, int seq,
                          int heads, int64_t pairs, float4* __restrict__ zero, int64_t zero_vectors) {
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < zero_vectors; v += threads) {
    zero[v] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const int64_t pair = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 16;
  const int lane = threadIdx.x % 16;
  const bool valid = pair < pairs;  // the whole warp stays for the shuffles
  const int64_t token = pair / heads;
  const int head = static_cast<int>(pair % heads);
  float sum = 0.f;
  if (valid) {
    const int64_t column = head * kHeadDim + lane * 8;
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(grad_o + token * grad_o_stride + column));
    const uint4 b = __ldg(reinterpret_cast<const uint4*>(o + token * o_stride + column));
    const auto* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
    const auto* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 x = __bfloat1622float2(a2[e]), y = __bfloat1622float2(b2[e]);
      sum += x.x * y.x + x.y * y.y;
    }
  }
#pragma unroll
  for (int offset = 8; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);  // within a half
  if (valid && lane == 0) {
    const int64_t b_index = token / seq, t = token % seq;
    dot[(b_index * heads + head) * seq + t] = sum;
  }
}

// Where element (row, col) of a consumer's 64 x 64 half of a step's dQ sits
// in its float32 sums: in the consumers' register order, so that each of a
// warp's 16-byte vector atomics adds onto 512 consecutive bytes. Thread tid =
// 32 warp + lane holds rows 16 warp + lane / 4 + 8 r (r = 0, 1) and columns
// 8 g + 2 (lane % 4) + {0, 1} of each group g of 8 columns in accumulators
// 4 g + 2 r + {0, 1}, stored as float4 number g * 128 + tid.
__host__ __device__ constexpr int DqHalfOffset(int row, int col) {
  return ((col / 8) * 128 + 32 * (row / 16) + 4 * (row % 8) + (col % 8) / 2) * 4 + (row % 16) / 8 * 2 + col % 2;
}
static_assert(DqHalfOffset(0, 0) == 0 && DqHalfOffset(0, 1) == 1 && DqHalfOffset(8, 0) == 2 &&
                  DqHalfOffset(8, 1) == 3 && DqHalfOffset(0, 2) == 4 && DqHalfOffset(1, 0) == 16 &&
                  DqHalfOffset(16, 0) == 128 && DqHalfOffset(0, 8) == 512 && DqHalfOffset(63, 63) == 4095,
              "the dQ half's layout");

// The rotary embedding's transpose on a pair of a head's elements, a (column
// i < 64) and b (column i + 64), in float32: a c + b s and b c - a s, cos and
// sin of position * inv_freq[i] (RopeCosSin).
__device__ __forceinline__ void RotateBack(float& a, float& b, float position, float inv_freq) {
  const float2 cs = RopeCosSin(position, inv_freq);
  const float ra = a * cs.x + b * cs.y;
  b = b * cs.x - a * cs.y;
  a = ra;
}

// dQ = scale * its float32 sums, rounded to bf16 into q's layout. A thread
// takes two rows 8 apart (what a float4 of the sums holds) and 8 columns of
// each half of the head, rotated back first where positions are given; the
// 8 threads of a row pair's column groups are adjacent (their stores, a row's
// 128 bytes of each half, coalesce).
__global__ void DqKernel(const float* __restrict__ dq_sums, __nv_bfloat16* __restrict__ grad_q, int64_t grad_q_stride,
                         int seq, int heads, int q64_tiles, float scale, const int64_t* __restrict__ positions,
                         const float* __restrict__ inv_freq, int64_t units) {
  int64_t unit = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (unit >= units) return;
  // unit = (((b * q64_tiles + i) * heads + head) * 32 + 8 w + q) * 8 + g: rows
  // 64 i + 16 w + q and + 8 of sequence b, columns 8 g .. 8 g + 7 (and + 64).
  const int g = static_cast<int>(unit % 8);
  unit /= 8;
  const int q = static_cast<int>(unit % 8), w = static_cast<int>(unit / 8 % 4);
  unit /= 32;
  const int head = static_cast<int>(unit % heads);
  unit /= heads;
  const int i = static_cast<int>(unit % q64_tiles);
  const int64_t b = unit / q64_tiles;
  const float* sums =
      dq_sums + ((b * heads + head) * q64_tiles + i) * kDqTileFloats + DqHalfOffset(16 * w + q, 8 * g);
  float v[2][2][8];  // [half][r][column]: float4 j holds columns 2 j, 2 j + 1 of rows r = 0, 1
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 x = *reinterpret_cast<const float4*>(sums + half * (kBackwardQ * 64) + 4 * j);
      v[half][0][2 * j] = x.x, v[half][0][2 * j + 1] = x.y, v[half][1][2 * j] = x.z, v[half][1][2 * j + 1] = x.w;
    }
  }
  const int col = 8 * g;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = i * kBackwardQ + 16 * w + q + 8 * r;
    if (t >= seq) continue;
    const int64_t token = b * seq + t;
    float* lo = v[0][r];
    float* hi = v[1][r];
    if (positions != nullptr) {
      const float position = static_cast<float>(__ldg(positions + token));
#pragma unroll
      for (int e = 0; e < 8; ++e) RotateBack(lo[e], hi[e], position, __ldg(inv_freq + col + e));
    }
    uint4 out_lo, out_hi;
    out_lo.x = PackBf16(lo[0] * scale, lo[1] * scale);
    out_lo.y = PackBf16(lo[2] * scale, lo[3] * scale);
    out_lo.z = PackBf16(lo[4] * scale, lo[5] * scale);
    out_lo.w = PackBf16(lo[6] * scale, lo[7] * scale);
    out_hi.x = PackBf16(hi[0] * scale, hi[1] * scale);
    out_hi.y = PackBf16(hi[2] * scale, hi[3] * scale);
    out_hi.z = PackBf16(hi[4] * scale, hi[5] * scale);
    out_hi.w = PackBf16(hi[6] * scale, hi[7] * scale);
    __nv_bfloat16* row = grad_q + token * grad_q_stride + head * kHeadDim + col;
    *reinterpret_cast<uint4*>(row) = out_lo;
    *reinterpret_cast<uint4*>(row + 64) = out_hi;
  }
}

static_assert(kScheduleKeys == kBlockKv && kScheduleQueries == kBackwardQ, "the schedule's tiles are the kernel's");

// A block for each slot (BackwardSlots): for each of its segments (keys j,
// kv head, sequence) the producer loads K and V, then Q and dO of each step
// (query head hh of the group, query tile i of 64 rows, in BackwardStep's
// order) into a ring that runs on across the segments. Consumer c owns keys
// 64 c .. 64 c + 63 and accumulates their dK and dV over the segment's steps
// in registers; a step:
//   S^T = K_c Q_i^T, dP^T = V_c dO_i^T            (64 keys x 64 queries each)
//   P^T = 2^(scale_log2 S^T - lse_i log2 e) (0 past the diagonal or the sequence),
//   dS^T = P^T (dP^T - D_i)
//   dV_c += P^T dO_i, dK_c += dS^T Q_i            (P^T and dS^T from registers)
//   dS^T to shared memory (both consumers' halves: 128 keys x 64 queries),
//   dQ_i[:, 64 c ..] = dS K[:, 64 c ..]           (over all 128 keys)
//   added onto the float32 sums by vector atomics from registers.
// At a segment's end dK (scaled) and dV go out through K's and V's shared
// memory, which the next segment's K and V then fill (dQ is scaled by the
// conversion kernel).
__global__ void __launch_bounds__(kThreads, 1) BackwardKernel(const __grid_constant__ BackwardMaps maps) {
  extern __shared__ uint8_t raw_smem[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw_smem) + 1023) & ~uintptr_t{1023});
  uint8_t* k_smem = smem;                     // box db (64 columns, 128 rows) at db * 16 KB
  uint8_t* v_smem = k_smem + kKBytes;         // likewise
  uint8_t* stages = v_smem + kVBytes;         // stage s: Q at s * 32 KB, dO at + 16 KB (boxes 8 KB apart)
  uint8_t* ds_smem = stages + kBackwardStages * 2 * kQ64Bytes;  // buffer n % 2 of step n: consumer c's keys at c * 8 KB
  // Stage s's log-sum-exps (log2 units) at rows[s][0][..], D at rows[s][1][..].
  auto* rows = reinterpret_cast<float(*)[2][kBackwardQ]>(ds_smem + 2 * kDsBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(ds_smem + 2 * kDsBytes + kRowBytes);
  uint64_t* empty = full + kBackwardStages;
  uint64_t* kv_full = empty + kBackwardStages;  // segment m's K and V loaded: phase m % 2
  uint64_t* kv_empty = kv_full + 1;             // segment m's dK and dV stored from K's and V's room: phase m % 2

  const int slot = static_cast<int>(blockIdx.x);
  int segments;
  const BackwardShape schedule{maps.shape.batch, maps.shape.kv_heads, maps.shape.group, maps.q64_tiles};
  SegmentOf(slot, 0, schedule, &segments);
  const int group = maps.shape.group;

  const int warpgroup = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kBackwardStages; ++s) {
      // Every lane that wrote (the rows' warp) or read (the consumers) a stage
      // arrives itself: an arrival releases only its own thread's accesses
      // (PTX memory model), which is what compute-sanitizer's racecheck checks.
      BarrierInit(&full[s], 1 + 32);  // the loads' thread (and their bytes), the rows' warp's lanes
      BarrierInit(&empty[s], 2 * 128);  // the consumers' threads
    }
    BarrierInit(kv_full, 1);
    BarrierInit(kv_empty, 2 * 128);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warpgroup == 0) {
    LowerRegisters<kBackwardProducerRegisters>();
    if (tid >= 32 && tid < 64) {
      // Warp 1: each step's 64 log-sum-exps and D values into the stage
      // (0 past the sequence), two of each a lane.
      const int lane = tid - 32;
      int n = 0;  // steps of the slot so far: the ring's position
      for (int m = 0; m < segments; ++m) {
        const BackwardSegment seg = SegmentOf(slot, m, schedule, &segments);
        // The group's first head's rows, then this lane's two of a tile.
        const int64_t first = (static_cast<int64_t>(seg.batch) * maps.shape.heads + seg.kv_head * group) *
                              maps.shape.seq;
        BackwardStep step(seg, maps.q64_tiles);
        for (const int n_end = n + seg.steps; n < n_end; ++n, step.Next(seg, group)) {
          const int s = n % kBackwardStages;
          const int query = step.i * kBackwardQ + 2 * lane;
          const int64_t at = first + static_cast<int64_t>(step.hh) * maps.shape.seq + query;
          float2 lse = make_float2(0.f, 0.f), dot = make_float2(0.f, 0.f);
          if (query < maps.shape.seq) {
            lse.x = __ldg(maps.lse + at) * kLog2e, dot.x = __ldg(maps.dot + at);
          }
          if (query + 1 < maps.shape.seq) {
            lse.y = __ldg(maps.lse + at + 1) * kLog2e, dot.y = __ldg(maps.dot + at + 1);
          }
          BarrierWait(&empty[s], ((n / kBackwardStages) & 1) ^ 1);
          *reinterpret_cast<float2*>(&rows[s][0][2 * lane]) = lse;
          *reinterpret_cast<float2*>(&rows[s][1][2 * lane]) = dot;
          BarrierArrive(&full[s]);
        }
      }
      return;
    }
    if (tid != 0) return;
    // Segment m's K and V, once the previous segment's dK and dV have left
    // their room; issued after the segment's first stages of Q and dO, which
    // need only the ring.
    auto load_kv = [&](const BackwardSegment& seg, int m) {
      if (m > 0) BarrierWait(kv_empty, (m - 1) & 1);
      BarrierExpectBytes(kv_full, kKBytes + kVBytes);
      for (int db = 0; db < 2; ++db) {
        const int col = seg.kv_head * kHeadDim + 64 * db;
        TmaLoad3(k_smem + db * kBoxBytes, &maps.k, col, seg.j * kBlockKv, seg.batch, kv_full);
        TmaLoad3(v_smem + db * kBoxBytes, &maps.v, col, seg.j * kBlockKv, seg.batch, kv_full);
      }
    };
    int n = 0;
    for (int m = 0; m < segments; ++m) {
      const BackwardSegment seg = SegmentOf(slot, m, schedule, &segments);
      const int kv_at = m == 0 ? 0 : (seg.steps < kBackwardStages ? seg.steps : kBackwardStages);
      BackwardStep step(seg, maps.q64_tiles);
      for (int local = 0;; ++local, ++n, step.Next(seg, group)) {
        if (local == kv_at) load_kv(seg, m);
        if (local == seg.steps) break;
        const int s = n % kBackwardStages;
        const int head = seg.kv_head * group + step.hh, i = step.i;
        BarrierWait(&empty[s], ((n / kBackwardStages) & 1) ^ 1);
        BarrierExpectBytes(&full[s], 2 * kQ64Bytes);
        uint8_t* q = stages + s * 2 * kQ64Bytes;
        for (int db = 0; db < 2; ++db) {
          TmaLoad3(q + db * kChunk, &maps.q, head * kHeadDim + 64 * db, i * kBackwardQ, seg.batch, &full[s]);
          TmaLoad3(q + kQ64Bytes + db * kChunk, &maps.grad_o, head * kHeadDim + 64 * db, i * kBackwardQ, seg.batch,
                   &full[s]);
        }
      }
    }
    return;
  }

  RaiseRegisters<kBackwardConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const int warp = tid / 32, lane = tid % 32;
  const uint32_t k_address = SmemAddress(k_smem + consumer * (kBoxBytes / 2));
  const uint32_t v_address = SmemAddress(v_smem + consumer * (kBoxBytes / 2));
  float dk[64], dv[64], dq[32];
  int n = 0;
  for (int m = 0; m < segments; ++m) {
    const BackwardSegment seg = SegmentOf(slot, m, schedule, &segments);
    // This thread's rows (keys) and columns (queries, within a step's 64) of
    // the 64 x 64 products: rows key0 and key0 + 8, columns 8 g + 2 (lane % 4) + {0, 1}.
    const int key0 = seg.j * kBlockKv + consumer * 64 + 16 * warp + lane / 4;
#pragma unroll
    for (int e = 0; e < 64; ++e) dk[e] = dv[e] = 0.f;
    // A step's dQ half (head, query tile i) onto its float32 sums, group g
    // in DqHalfOffset's order: each of a warp's atomics adds 512 consecutive
    // bytes (red.global.add.v4.f32). Staging the half in shared
    // memory for one bulk reduction (TMA) instead was measured no faster and
    // spent 32 KB of shared memory and two barriers a step (NOTES.md).
    auto add_dq = [&](int head, int i) {
      float* sums = maps.dq_sums +
                    ((static_cast<int64_t>(seg.batch) * maps.shape.heads + head) * maps.q64_tiles + i) *
                        kDqTileFloats +
                    consumer * (kBackwardQ * 64);
      FenceRegisters(dq);
#pragma unroll
      for (int g = 0; g < 8; ++g) {
        atomicAdd(reinterpret_cast<float4*>(sums) + g * 128 + tid,
                  make_float4(dq[4 * g], dq[4 * g + 1], dq[4 * g + 2], dq[4 * g + 3]));
      }
    };
    BarrierWait(kv_full, m & 1);
    BackwardStep step(seg, maps.q64_tiles);
    for (const int n_end = n + seg.steps; n < n_end; ++n, step.Next(seg, group)) {
      const int s = n % kBackwardStages;
      const int head = seg.kv_head * group + step.hh, i = step.i;
      const int query0 = i * kBackwardQ + 2 * (lane % 4);
      BarrierWait(&full[s], (n / kBackwardStages) & 1);
      uint8_t* q_stage = stages + s * 2 * kQ64Bytes;
      uint8_t* do_stage = q_stage + kQ64Bytes;
      const uint32_t q_address = SmemAddress(q_stage), do_address = SmemAddress(do_stage);
      float st[32], dpt[32];
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint32_t kv_step = (kk / 4) * kBoxBytes + (kk % 4) * 32, q_step = (kk / 4) * kChunk + (kk % 4) * 32;
        WgmmaSS64<0, 0>(st, DescriptorK(k_address + kv_step), DescriptorK(q_address + q_step), kk > 0);
      }
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint32_t kv_step = (kk / 4) * kBoxBytes + (kk % 4) * 32, q_step = (kk / 4) * kChunk + (kk % 4) * 32;
        WgmmaSS64<0, 0>(dpt, DescriptorK(v_address + kv_step), DescriptorK(do_address + q_step), kk > 0);
      }
      WgmmaCommit();
      WgmmaWait<0>();
      FenceRegisters(st);
      FenceRegisters(dpt);

      // P^T into st. Masked: a key past its query (only the steps that reach
      // the diagonal: i < first_i + 2) or a query past the sequence.
      const bool diagonal = i < seg.first_i + kBlockKv / kBackwardQ;
#pragma unroll
      for (int g = 0; g < 8; ++g) {
        const float2 lse2 = *reinterpret_cast<const float2*>(&rows[s][0][8 * g + 2 * (lane % 4)]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int query = query0 + 8 * g + (e & 1), key = key0 + 8 * (e >> 1);
          const bool masked = query >= maps.shape.seq || (diagonal && key > query);
          st[4 * g + e] = masked ? 0.f : Exp2(st[4 * g + e] * maps.shape.scale_log2 - ((e & 1) ? lse2.y : lse2.x));
        }
      }
      uint32_t pt[16], dst[16];
#pragma unroll
      for (int g = 0; g < 16; ++g) pt[g] = PackBf16(st[2 * g], st[2 * g + 1]);

      // dS^T = P^T (dP^T - D) into dpt (0 where P^T is).
#pragma unroll
      for (int g = 0; g < 8; ++g) {
        const float2 dot = *reinterpret_cast<const float2*>(&rows[s][1][8 * g + 2 * (lane % 4)]);
#pragma unroll
        for (int e = 0; e < 4; ++e) dpt[4 * g + e] = st[4 * g + e] * (dpt[4 * g + e] - ((e & 1) ? dot.y : dot.x));
      }
      uint8_t* ds = ds_smem + (n % 2) * kDsBytes;
      WriteChunk(ds + consumer * kChunk, warp, lane, 0, [&](int g, int e) { return dpt[4 * g + e]; });
#pragma unroll
      for (int g = 0; g < 16; ++g) dst[g] = PackBf16(dpt[2 * g], dpt[2 * g + 1]);
      FenceAsyncShared();
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kBackwardQ / 16; ++kk) {
        const uint32_t a[4] = {pt[4 * kk], pt[4 * kk + 1], pt[4 * kk + 2], pt[4 * kk + 3]};
        WgmmaRS(dv, a, DescriptorMN(do_address + kk * 2048));
      }
#pragma unroll
      for (int kk = 0; kk < kBackwardQ / 16; ++kk) {
        const uint32_t a[4] = {dst[4 * kk], dst[4 * kk + 1], dst[4 * kk + 2], dst[4 * kk + 3]};
        WgmmaRS(dk, a, DescriptorMN(q_address + kk * 2048));
      }
      WgmmaCommit();
      NamedBarrier(1, 256);  // both consumers' halves of dS^T written
      const uint32_t ds_address = SmemAddress(ds);
      const uint32_t k_half = SmemAddress(k_smem + consumer * kBoxBytes);
#pragma unroll
      for (int kk = 0; kk < kBlockKv / 16; ++kk) {
        WgmmaSS64<1, 1>(dq, DescriptorMN(ds_address + kk * 2048), DescriptorMN(k_half + kk * 2048), kk > 0);
      }
      WgmmaCommit();
      // The stage's Q and dO are read once dV's and dK's products are done (and
      // this thread's reads of its rows).
      WgmmaWait<1>();
      BarrierArrive(&empty[s]);
      WgmmaWait<0>();
      add_dq(head, i);
    }

    // dK rotated back where the rotary embedding made k: columns 8 g + ..
    // of the first half (g < 8) pair with the same of the second (g + 8).
    if (maps.rope_positions != nullptr) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int key = key0 + 8 * r;
        if (key >= maps.shape.seq) continue;
        const float position =
            static_cast<float>(__ldg(maps.rope_positions + static_cast<int64_t>(seg.batch) * maps.shape.seq + key));
#pragma unroll
        for (int g = 0; g < 8; ++g) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float inv_freq = __ldg(maps.rope_inv_freq + 8 * g + 2 * (lane % 4) + c);
            RotateBack(dk[4 * g + 2 * r + c], dk[4 * (g + 8) + 2 * r + c], position, inv_freq);
          }
        }
      }
    }
    // dK (scaled) and dV, rounded to bf16 into K's and V's room once both
    // consumers are done reading it (consumer c's 64 rows: the lower or upper
    // half of each 128-row box, the 64-row boxes of the stores' maps), stored
    // by TMA; then the room is the next segment's (kv_empty).
    NamedBarrier(1, 256);
    for (int db = 0; db < 2; ++db) {
      uint8_t* half = k_smem + db * kBoxBytes + consumer * (kBoxBytes / 2);
      WriteChunk(half, warp, lane, 8 * db, [&](int g, int e) { return dk[4 * g + e] * maps.shape.scale; });
      WriteChunk(half + kKBytes, warp, lane, 8 * db, [&](int g, int e) { return dv[4 * g + e]; });
    }
    FenceAsyncShared();
    NamedBarrier(2 + consumer, 128);
    if (tid == 0) {
      for (int db = 0; db < 2; ++db) {
        const int col = seg.kv_head * kHeadDim + 64 * db, row = seg.j * kBlockKv + consumer * 64;
        uint8_t* half = k_smem + db * kBoxBytes + consumer * (kBoxBytes / 2);
        TmaStore3Uncommitted(&maps.grad_k, half, col, row, seg.batch);
        TmaStore3Uncommitted(&maps.grad_v, half + kKBytes, col, row, seg.batch);
      }
      TmaStoreCommit();
      TmaStoreWaitRead<0>();
    }
    NamedBarrier(2 + consumer, 128);  // the stores have read this consumer's rows
    BarrierArrive(kv_empty);
  }
  if (tid == 0) TmaStoreWaitAll();
}

// Query tiles of 64 rows (the backward's) over a sequence, and the floats of
// dQ's sums (the workspace's first part; each row's D after them).
int64_t Q64Tiles(int64_t seq) { return (seq + kBackwardQ - 1) / kBackwardQ; }
int64_t DqSumsFloats(int64_t batch, int64_t seq, int64_t heads) {
  return batch * heads * Q64Tiles(seq) * kDqTileFloats;
}

SequenceShape ShapeOf(const HopperAttentionOperands& a) {
  SequenceShape shape;
  shape.seq = static_cast<int>(a.seq);
  shape.heads = static_cast<int>(a.heads);
  shape.group = static_cast<int>(a.heads / a.kv_heads);
  shape.kv_heads = static_cast<int>(a.kv_heads);
  shape.batch = static_cast<int>(a.batch);
  shape.scale = a.scale;
  shape.scale_log2 = a.scale * kLog2e;
  return shape;
}

// The operands' checks that the forward and the backward share: "" or why not.
std::string CheckOperands(const HopperAttentionOperands& a) {
  if (!CurrentDevice().hopper) return "the current device is not a Hopper GPU (compute capability 9.0)";
  if (a.batch <= 0 || a.seq <= 0 || a.heads <= 0 || a.kv_heads <= 0 || a.heads % a.kv_heads != 0) {
    return "batch, seq, heads and kv_heads must be positive, heads a multiple of kv_heads";
  }
  if (a.lse == nullptr || !Aligned(a.q) || !Aligned(a.k) || !Aligned(a.v) || !Aligned(a.o) || a.q_stride % 8 != 0 ||
      a.k_stride % 8 != 0 || a.v_stride % 8 != 0 || a.o_stride % 8 != 0 || a.q_stride < a.heads * kHeadDim ||
      a.k_stride < a.kv_heads * kHeadDim || a.v_stride < a.kv_heads * kHeadDim || a.o_stride < a.heads * kHeadDim) {
    return "pointers must be 16-byte aligned, row strides multiples of 8 elements of at least the heads' columns, "
           "and lse given";
  }
  if (Q64Tiles(a.seq) * a.batch * a.heads >= (int64_t{1} << 31) || a.seq * a.batch >= (int64_t{1} << 31)) {
    return "too many rows";
  }
  return "";
}

// A 3-D map over (batch, seq, columns) of rows `stride` apart, box box_rows x 64.
std::string SequenceMap(CUtensorMap* map, const void* base, const HopperAttentionOperands& a, int64_t columns,
                        int64_t stride, int box_rows) {
  return Map(map, base, a.seq, columns, stride, box_rows, a.batch, a.seq * stride);
}

std::string Launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("HopperAttention: ") + what + " failed: " + cudaGetErrorString(e);
}

}  // namespace

bool HopperAttentionSuits() { return CurrentDevice().hopper; }

std::string HopperAttentionForward(const HopperAttentionOperands& a, void* stream) {
  std::string why = CheckOperands(a);
  AttentionMaps maps{};
  if (why.empty()) why = SequenceMap(&maps.q, a.q, a, a.heads * kHeadDim, a.q_stride, kBlockQ);
  if (why.empty()) why = SequenceMap(&maps.k, a.k, a, a.kv_heads * kHeadDim, a.k_stride, kBlockKv);
  if (why.empty()) why = SequenceMap(&maps.v, a.v, a, a.kv_heads * kHeadDim, a.v_stride, 64);
  if (why.empty()) why = SequenceMap(&maps.o, a.o, a, a.heads * kHeadDim, a.o_stride, 64);
  if (why.empty()) why = AllowSharedMemory<ForwardKernel>(kSmemBytes);
  if (!why.empty()) return "HopperAttention: " + why;
  const int64_t q_tiles = (a.seq + kBlockQ - 1) / kBlockQ;
  maps.lse = a.lse;
  maps.shape = ShapeOf(a);
  maps.q_tiles = static_cast<int>(q_tiles);
  const int blocks = static_cast<int>(q_tiles * a.batch * a.heads);
  ForwardKernel<<<blocks, kThreads, kSmemBytes, static_cast<cudaStream_t>(stream)>>>(maps);
  return Launched("the forward's launch");
}

int64_t HopperAttentionWorkspaceBytes(int64_t batch, int64_t seq, int64_t heads) {
  return (DqSumsFloats(batch, seq, heads) + batch * heads * seq) * 4;
}

std::string HopperAttentionBackward(const HopperAttentionGradientOperands& g, void* stream) {
  const HopperAttentionOperands& a = g.forward;
  std::string why = CheckOperands(a);
  if (why.empty() && (g.workspace == nullptr || !Aligned(g.workspace) || !Aligned(g.grad_o) || !Aligned(g.grad_q) ||
                      !Aligned(g.grad_k) || !Aligned(g.grad_v) || g.grad_o_stride % 8 != 0 ||
                      g.grad_q_stride % 8 != 0 || g.grad_k_stride % 8 != 0 || g.grad_v_stride % 8 != 0 ||
                      g.grad_o_stride < a.heads * kHeadDim || g.grad_q_stride < a.heads * kHeadDim ||
                      g.grad_k_stride < a.kv_heads * kHeadDim || g.grad_v_stride < a.kv_heads * kHeadDim)) {
    why = "the gradients and the workspace must be 16-byte aligned, their row strides multiples of 8 elements of "
          "at least the heads' columns";
  }
  if (why.empty() && (g.rope_positions == nullptr) != (g.rope_inv_freq == nullptr)) {
    why = "rope_positions and rope_inv_freq go together: both or neither";
  }
  BackwardMaps maps{};
  if (why.empty()) why = SequenceMap(&maps.q, a.q, a, a.heads * kHeadDim, a.q_stride, kBackwardQ);
  if (why.empty()) why = SequenceMap(&maps.k, a.k, a, a.kv_heads * kHeadDim, a.k_stride, kBlockKv);
  if (why.empty()) why = SequenceMap(&maps.v, a.v, a, a.kv_heads * kHeadDim, a.v_stride, kBlockKv);
  if (why.empty()) why = SequenceMap(&maps.grad_o, g.grad_o, a, a.heads * kHeadDim, g.grad_o_stride, kBackwardQ);
  if (why.empty()) why = SequenceMap(&maps.grad_k, g.grad_k, a, a.kv_heads * kHeadDim, g.grad_k_stride, 64);
  if (why.empty()) why = SequenceMap(&maps.grad_v, g.grad_v, a, a.kv_heads * kHeadDim, g.grad_v_stride, 64);
  if (why.empty()) why = AllowSharedMemory<BackwardKernel>(kBackwardSmemBytes);
  if (!why.empty()) return "HopperAttention: " + why;
  const int64_t sums = DqSumsFloats(a.batch, a.seq, a.heads);
  auto* workspace = static_cast<float*>(g.workspace);
  auto* s = static_cast<cudaStream_t>(stream);
  maps.lse = a.lse;
  maps.dot = workspace + sums;
  maps.dq_sums = workspace;
  maps.rope_positions = g.rope_positions;
  maps.rope_inv_freq = g.rope_inv_freq;
  maps.shape = ShapeOf(a);
  maps.q64_tiles = static_cast<int>(Q64Tiles(a.seq));

  const int64_t pairs = a.batch * a.seq * a.heads;
  static_assert(kDqTileFloats % 4 == 0, "dQ's sums are whole float4s");
  DotKernel<<<static_cast<unsigned>((pairs * 16 + 255) / 256), 256, 0, s>>>(
      static_cast<const __nv_bfloat16*>(g.grad_o), g.grad_o_stride, static_cast<const __nv_bfloat16*>(a.o),
      a.o_stride, workspace + sums, maps.shape.seq, maps.shape.heads, pairs, reinterpret_cast<float4*>(workspace),
      sums / 4);
  why = Launched("dO.O's launch (and dQ's sums zeroed)");
  if (!why.empty()) return why;
  const int blocks = BackwardSlots(BackwardShape{maps.shape.batch, maps.shape.kv_heads, maps.shape.group,
                                                 maps.q64_tiles});
  BackwardKernel<<<blocks, kThreads, kBackwardSmemBytes, s>>>(maps);
  why = Launched("the backward's launch");
  if (!why.empty()) return why;
  const int64_t units = a.batch * maps.q64_tiles * a.heads * 32 * 8;  // DqKernel's: row pairs x column groups
  DqKernel<<<static_cast<unsigned>((units + 255) / 256), 256, 0, s>>>(
      workspace, static_cast<__nv_bfloat16*>(g.grad_q), g.grad_q_stride, maps.shape.seq, maps.shape.heads,
      maps.q64_tiles, a.scale, g.rope_positions, g.rope_inv_freq, units);
  return Launched("dQ's conversion");
}

}  // namespace trainerd::kernels
