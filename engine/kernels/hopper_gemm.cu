// The Hopper GEMM (hopper_gemm.h): kernel and launcher. Built for
// sm_90a only (wgmma, setmaxnreg). bench/gemm/hopper_gemm.cu checks it against
// cuBLAS and float64 and times it; its compile-time knobs (-D) build that
// harness's variants.
#include "engine/kernels/hopper_gemm.h"
#include "engine/kernels/hopper_primitives.cuh"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

// The schedule: one persistent block an SM, tiles of 128 x 256 shared by
// two consumer warpgroups (cooperative); each finished tile handed over to
// the producer warpgroup's three idle warps through a 64 KB buffer, so that
// its epilogue (the stores by TMA, SwiGLU's arithmetic) runs under the next
// tile's main loop. Schedules measured against it and removed (bench/speed/
// NOTES.md, "The epilogue under the main loop"): the consumers storing their
// own tile between main loops, chunk by chunk or a whole tile at a time, and
// ping-pong 128 x 128 tiles a consumer.
#ifndef HG_BACKWARD_TMA
// SwiGLU's backward epilogue: 1 gate and up come by TMA into a 16 KB staging
// area, 64 x 64 chunk by chunk, and dgate and dup leave by TMA (the loop that
// level 3, with LoRA's sums, always runs); 0 the epilogue warps load and
// store them themselves, HG_BACKWARD_UNITS 16-byte units a thread in flight.
#define HG_BACKWARD_TMA 0
#endif
#ifndef HG_BACKWARD_UNITS
#define HG_BACKWARD_UNITS 4
#endif
#ifndef HG_LORA_REGISTERS
// SwiGLU's backward with LoRA's sums: the producer warpgroup's registers a
// thread (the epilogue warps'), the consumers' what is left (176 at 152).
// ptxas spills 4 bytes of the epilogue warps' at 152 and 150-290 at 136-120;
// at 168 the consumers' (then 168) spill.
#define HG_LORA_REGISTERS 152
#endif
#ifndef HG_LORA_FORWARD_REGISTERS
// SwiGLU's forward with down's LoRA product over h: the producer warpgroup's
// registers a thread (the epilogue warps'), the consumers' what is left (200 at
// 96). ptxas spills 56-88 bytes of the epilogue warps' at 80 and 72, none at 96.
#define HG_LORA_FORWARD_REGISTERS 96
#endif
#ifndef HG_BACKWARD_PREFETCH
// SwiGLU's backward: 1 the producer asks L2 for a tile's gate and up when
// it starts loading the tile's k-slices, a main loop before the epilogue
// reads them (128 KB a tile, about 17 MB in flight on 132 SMs); 0 not.
#define HG_BACKWARD_PREFETCH 0
#endif
#ifndef HG_STAGES
#define HG_STAGES 3  // the ring's depth (the hand-over buffer takes the fourth stage's room)
#endif
#ifndef HG_GROUP
#define HG_GROUP 16  // the rasterisation's group of 128-row tiles
#endif
#ifndef HG_FAST_SILU
// SiLU in the SwiGLU epilogue (and the sigmoid in its backward's): 1 g *
// rcp.approx(1 + ex2.approx(-g log2 e)) (two MUFU operations); 2 g/2 * (1 +
// tanh.approx(g/2)) (one); 0 expf and a division (accurate).
#define HG_FAST_SILU 1
#endif

namespace trainerd::kernels {
namespace {

using namespace hopper;  // NOLINT(build/namespaces): the shared primitives

constexpr int kBlockM = 128, kBlockN = 256, kBlockK = 64;
constexpr int kStages = HG_STAGES;
constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
// Registers a thread at launch: one block of kThreads an SM (__launch_bounds__),
// 65,536 / 384 rounded down to the allocation's multiple of 8 (ptxas -v: 168).
constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
constexpr int kChunk = 64;     // epilogue chunk: 64 rows x 64 columns
constexpr int kABytes = kBlockM * kBlockK * 2;    // 16 KB
constexpr int kBBytes = kBlockN * kBlockK * 2;    // 32 KB
constexpr int kBoxBytes = 64 * 64 * 2;            // an MN-major box of W: 64 k-rows x 64 columns
constexpr int kChunkBytes = kChunk * kChunk * 2;  // 8 KB
// The hand-over buffer: the whole tile, column block c (64 columns) of
// consumer w's rows at chunk 2 c + w.
constexpr int kHandOverBytes = 8 * kChunkBytes;  // 64 KB
// SwiGLU's backward's staging area, two chunks: gate's and up's, by TMA
// (with LoRA's sums, dup and h made over them).
constexpr int kStagingBytes = 2 * kChunkBytes;
// Whether a kernel has the staging area: SwiGLU's backward by TMA, or with
// LoRA's sums.
template <HopperEpilogue kEpilogue, bool kLoraSums>
__host__ __device__ constexpr bool Stages() {
  return kEpilogue == HopperEpilogue::kSwiGluBackward && (HG_BACKWARD_TMA || kLoraSums);
}
// Shared memory a block: the ring, the hand-over buffer, the staging area
// (above), the barriers, and 1 KB for the alignment.
template <HopperEpilogue kEpilogue, bool kLoraSums>
constexpr int SmemBytes() {
  return kStages * (kABytes + kBBytes) + kHandOverBytes + (Stages<kEpilogue, kLoraSums>() ? kStagingBytes : 0) +
         (2 * kStages + 3) * 8 + 1024;
}
static_assert(SmemBytes<HopperEpilogue::kSwiGluBackward, true>() <= 227 * 1024,
              "shared memory over the 227 KB a block may have");

// d (64 x 256, this thread's 128 values) += A (64 x 16) B (256 x 16)^T, or =
// when accumulate is 0; B MN-major when kTransposeB.
template <int kTransposeB>
__device__ __forceinline__ void Wgmma256(float (&d)[128], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, %131;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]),
        "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]),
        "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]),
        "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(accumulate), "n"(kTransposeB));
}

struct TileCoordinates {
  int m, n;  // tile indices
};

// Tile t in a rasterisation that walks HG_GROUP row tiles down each column of
// tiles before moving right, so that the blocks in flight share X's and W's
// k-slices in L2.
__device__ __forceinline__ TileCoordinates Tile(int t, int tiles_m, int tiles_n) {
  const int per_group = HG_GROUP * tiles_n;
  const int first_m = (t / per_group) * HG_GROUP;
  const int size = min(tiles_m - first_m, HG_GROUP);
  const int in_group = t % per_group;
  return {first_m + in_group % size, in_group / size};
}

__device__ __forceinline__ float Silu(float g) {
#if HG_FAST_SILU == 2
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(0.5f * g));
  return 0.5f * g * (1.0f + t);
#elif HG_FAST_SILU
  return g * __fdividef(1.0f, 1.0f + __expf(-g));
#else
  return g / (1.0f + expf(-g));
#endif
}

// sigmoid(g) for SwiGLU's backward, by the same instructions as Silu's.
[[maybe_unused]] __device__ __forceinline__ float Sigmoid(float g) {
#if HG_FAST_SILU == 2
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(0.5f * g));
  return 0.5f * (1.0f + t);
#elif HG_FAST_SILU
  return __fdividef(1.0f, 1.0f + __expf(-g));
#else
  return 1.0f / (1.0f + expf(-g));
#endif
}


struct GemmMaps {
  CUtensorMap x;     // (M, K), box 64 x 128
  CUtensorMap w;     // as stored (N, K): box 64 x 256; SwiGLU: gate's rows (N/2, K), box 64 x 128;
                     // transposed (K, N): box 64 columns x 64 k-rows
  CUtensorMap w_up;  // SwiGLU: up's rows (N/2, K), box 64 x 128
  CUtensorMap d;     // (M, N); SwiGLU: D's gate columns (M, N/2); box 64 x 64
  CUtensorMap d_up;  // SwiGLU: D's up columns (M, N/2)
  CUtensorMap h;     // SwiGLU: H (M, N/2)
  CUtensorMap gate;  // SwiGLU's backward by TMA: gate (M, N) and up (M, N) of [gate | up]
  CUtensorMap up;
  int tiles_m, tiles_n, k_tiles;
  // SwiGLU's backward: [gate | up] read and [dgate | dup] written by plain
  // loads and stores (rows of 2 n, strides in elements).
  const __nv_bfloat16* gate_up;
  __nv_bfloat16* grad;
  int64_t gate_up_stride, grad_stride;
  int m, n;
  // Rotary: each row's position, a head's 64 frequencies, D's rotated columns.
  const int64_t* positions;
  const float* inv_freq;
  int rotate_columns;
  // SwiGLU's backward, LoRA's sums (HopperGemmOperands::lora_*): sums null
  // where not asked.
  const __nv_bfloat16* lora_t;
  const __nv_bfloat16* lora_u;
  int64_t lora_t_stride, lora_u_stride;
  int rank_gate, rank_up, rank_h;
  float* lora_b_sums;
  float* lora_a_sums;
  // SwiGLU's forward, down's LoRA product over h (HopperGemmOperands::
  // lora_a, lora_h_sums; rank_h down's rank): sums null where not asked.
  const __nv_bfloat16* lora_a;
  int64_t lora_a_stride;
  float* lora_h_sums;
  int64_t lora_h_sums_stride;
};

// The rotary embedding over one 16-byte unit of a head's first half (a: 8
// elements, columns i0 .. i0 + 7 of the head) and the matching unit of its
// second half (b), in place: the rotary kernel's formula (rope.cu), cos and
// sin as RopeCosSin gives them.
[[maybe_unused]] __device__ __forceinline__ void Rotate8(uint4& a, uint4& b, float position,
                                                        const float* __restrict__ inv_freq, int i0) {
  auto* a2 = reinterpret_cast<__nv_bfloat162*>(&a);
  auto* b2 = reinterpret_cast<__nv_bfloat162*>(&b);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 c0 = RopeCosSin(position, __ldg(inv_freq + i0 + 2 * e));
    const float2 c1 = RopeCosSin(position, __ldg(inv_freq + i0 + 2 * e + 1));
    const float2 x = __bfloat1622float2(a2[e]), y = __bfloat1622float2(b2[e]);
    a2[e] = __floats2bfloat162_rn(x.x * c0.x - y.x * c0.y, x.y * c1.x - y.y * c1.y);
    b2[e] = __floats2bfloat162_rn(y.x * c0.x + x.x * c0.y, y.y * c1.x + x.y * c1.y);
  }
}

// SwiGLU's backward on 8 elements (16 bytes of each operand), the engine's
// pass's formula (engine/kernels/swiglu.cu, each result rounded once; the
// sigmoid as HG_FAST_SILU takes it): dgate = dh up s (1 + g (1 - s)),
// dup = dh g s, s = sigmoid(g).
[[maybe_unused]] __device__ __forceinline__ void SwiGluBackward8(const uint4& dh, const uint4& gate, const uint4& up,
                                                                uint4& dgate, uint4& dup) {
  const auto* d2 = reinterpret_cast<const __nv_bfloat162*>(&dh);
  const auto* g2 = reinterpret_cast<const __nv_bfloat162*>(&gate);
  const auto* u2 = reinterpret_cast<const __nv_bfloat162*>(&up);
  auto* dg2 = reinterpret_cast<uint32_t*>(&dgate);
  auto* du2 = reinterpret_cast<uint32_t*>(&dup);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 d = __bfloat1622float2(d2[e]), g = __bfloat1622float2(g2[e]), u = __bfloat1622float2(u2[e]);
    const float sx = Sigmoid(g.x), sy = Sigmoid(g.y);
    du2[e] = PackBf16(d.x * g.x * sx, d.y * g.y * sy);
    dg2[e] = PackBf16(d.x * u.x * sx * (1.f + g.x * (1.f - sx)), d.y * u.y * sy * (1.f + g.y * (1.f - sy)));
  }
}

// h = silu(gate) * up on 8 elements, each rounded once: SwiGLU's forward's
// epilogue, and its backward's h for LoRA's sums (the same instructions, so
// the same h as the forward's GEMM wrote).
__device__ __forceinline__ uint4 SwiGlu8(const uint4& gate, const uint4& up) {
  const auto* g2 = reinterpret_cast<const __nv_bfloat162*>(&gate);
  const auto* u2 = reinterpret_cast<const __nv_bfloat162*>(&up);
  uint4 out;
  uint32_t* o = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 gf = __bfloat1622float2(g2[e]), uf = __bfloat1622float2(u2[e]);
    o[e] = PackBf16(Silu(gf.x) * uf.x, Silu(gf.y) * uf.y);
  }
  return out;
}

// Elements (row, col) and (row + 1, col) of t (rows t_stride apart) as a
// bf16 pair, the first in the low half; zero past `rows` rows or `rank`
// columns: an A fragment's register of t^T for mma.sync.
__device__ __forceinline__ uint32_t ThinPair(const __nv_bfloat16* t, int64_t t_stride, int row, int col, int rows,
                                             int rank) {
  if (col >= rank) return 0;
  const auto* p = reinterpret_cast<const unsigned short*>(t) + static_cast<int64_t>(row) * t_stride + col;
  const uint32_t lo = row < rows ? __ldg(p) : 0u;
  const uint32_t hi = row + 1 < rows ? __ldg(p + t_stride) : 0u;
  return lo | (hi << 16);
}

// c (16 x 8, float32) += a (16 x 16) b (16 x 8), bf16 operands: mma.sync's
// fragments (a: rows lane / 4 and + 8, columns 2 (lane % 4) + {0, 1} and + 8;
// b: its columns' pairs of rows; c: rows lane / 4 and + 8, columns 2 (lane % 4) + {0, 1}).
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// *p += (a, b) for p 8-byte aligned in global memory, by one vector
// reduction (no value returned).
__device__ __forceinline__ void RedAdd2(float* p, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
}

// One warp's LoRA sum over a 64 x 64 chunk C of the epilogue (bf16 in the
// hand-over buffer's swizzle; rows row0 .. row0 + 63 of the product, columns
// col0 .. col0 + 63): sums (rank, n; rows n floats apart) += t^T C for t
// (rows, rank) the thin operand's rows row0 .. row0 + 63, on mma.sync
// m16n8k16 in blocks of 16 of the rank, added by 8-byte atomics. The chunk
// holds zeros past the product's rows and columns.
// A = t^T's fragments for rank block mb (16 of the rank) over the chunk's
// 64 rows from row0, all four k-steps' (their loads' latencies overlap).
__device__ __forceinline__ void ThinFragments(uint32_t (&a_all)[4][4], const __nv_bfloat16* t, int64_t t_stride,
                                              int rank, int rows, int row0, int mb, int lane) {
  const int g = lane / 4, pair = 2 * (lane % 4);
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a_all[ks][i] = ThinPair(t, t_stride, row0 + ks * 16 + pair + (i >> 1) * 8, mb + g + (i & 1) * 8, rows, rank);
    }
  }
}

// first: rank block 0's fragments (ThinFragments), loaded by the caller
// ahead of the chunk's other work.
__device__ __forceinline__ void ChunkSums(const uint32_t (&first)[4][4], const __nv_bfloat16* t, int64_t t_stride,
                                          int rank, float* sums, int n, int rows, const uint8_t* chunk, int row0,
                                          int col0, int lane) {
  const int g = lane / 4, pair = 2 * (lane % 4);
  for (int mb = 0; mb < rank; mb += 16) {
    float acc[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    uint32_t a_all[4][4];
    if (mb == 0) {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a_all[ks][i] = first[ks][i];
      }
    } else {
      ThinFragments(a_all, t, t_stride, rank, rows, row0, mb, lane);
    }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const uint32_t(&a)[4] = a_all[ks];
      // B = C's 16 rows: ldmatrix's transpose gives each column's pairs of
      // rows; lane l addresses row l % 8 of matrix l / 8 (matrices: rows
      // 0-7 and 8-15 of column units 2 j and 2 j + 1).
      const int matrix = lane / 8;
      const int r = ks * 16 + (matrix & 1) * 8 + lane % 8;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int unit = 2 * j + (matrix >> 1);
        const uint32_t address = SmemAddress(chunk + r * 128 + ((unit ^ (r % 8)) * 16));
        uint32_t b0, b1, b2, b3;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                     : "r"(address)
                     : "memory");
        Mma16816(acc[2 * j], a, b0, b1);
        Mma16816(acc[2 * j + 1], a, b2, b3);
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int col = col0 + 8 * j + pair;
      if (col >= n) continue;
      const int r0 = mb + g, r1 = r0 + 8;
      if (r0 < rank) RedAdd2(sums + static_cast<int64_t>(r0) * n + col, acc[j][0], acc[j][1]);
      if (r1 < rank) RedAdd2(sums + static_cast<int64_t>(r1) * n + col, acc[j][2], acc[j][3]);
    }
  }
}

// The LoRA sum that epilogue warp e (0-2) adds (GemmMaps's lora_*): 0
// t_gate^T dgate into the B sums' first rank_gate rows, 1 t_up^T dup into
// the next rank_up, 2 u^T h into the A sums; rank 0 when it is not asked.
struct LoraSum {
  const __nv_bfloat16* thin;  // the thin operand's first column (rows thin_stride apart)
  int64_t thin_stride;
  float* sums;  // the sum's first row (rows n floats apart)
  int rank;
};
__device__ __forceinline__ LoraSum LoraSumOfWarp(const GemmMaps& maps, int e) {
  const int64_t b_row = e == 1 ? static_cast<int64_t>(maps.rank_gate) * maps.n : 0;
  float* sums = e == 2 ? maps.lora_a_sums : maps.lora_b_sums == nullptr ? nullptr : maps.lora_b_sums + b_row;
  return {e == 2 ? maps.lora_u : maps.lora_t + (e == 1 ? maps.rank_gate : 0),
          e == 2 ? maps.lora_u_stride : maps.lora_t_stride, sums,
          sums == nullptr ? 0 : e == 0 ? maps.rank_gate : e == 1 ? maps.rank_up : maps.rank_h};
}

// Elements (row, col) and (row, col + 1) of a (rows a_stride apart) as a
// bf16 pair, the first in the low half; zero past `rows` rows or `cols`
// columns (cols even, col even): a B fragment's register of a^T for mma.sync.
__device__ __forceinline__ uint32_t RowPair(const __nv_bfloat16* a, int64_t a_stride, int row, int col, int rows,
                                            int cols) {
  if (row >= rows || col >= cols) return 0;
  return __ldg(reinterpret_cast<const uint32_t*>(a + static_cast<int64_t>(row) * a_stride + col));
}

// One warp's share of down's LoRA product over h in SwiGLU's forward: sums
// (rows sums_stride floats apart, even) += H a^T for H the 64 x 128 block of
// h in chunks c0 and c1 (bf16 in the hand-over buffer's swizzle: rows row0 ..
// row0 + 63 of the product, h's columns col0 .. col0 + 63 in c0 and the next
// 64 in c1) and a (rank, f; rows a_stride apart) down's A's stacked, on
// mma.sync m16n8k16 in blocks of 16 of the rank, added by 8-byte atomics. The
// chunks hold zeros past the product's rows and h's columns, and a's
// fragments are zero past its rank and f, so the sums take nothing from
// outside the product; rows past m are not added.
__device__ __forceinline__ void HRowSums(const uint8_t* c0, const uint8_t* c1, const __nv_bfloat16* a,
                                         int64_t a_stride, int rank, int f, float* sums, int64_t sums_stride, int m,
                                         int row0, int col0, int lane) {
  const int g = lane / 4, pair = 2 * (lane % 4);
  for (int nb = 0; nb < rank; nb += 16) {
    float acc[4][2][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
    }
#pragma unroll 2
    for (int ks = 0; ks < 8; ++ks) {
      const uint8_t* chunk = ks < 4 ? c0 : c1;
      const int col = col0 + ks * 16 + pair;
      // B = a^T's 16 columns of h by 8 of the rank, two blocks of 8.
      uint32_t b[2][2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        b[j][0] = RowPair(a, a_stride, nb + 8 * j + g, col, rank, f);
        b[j][1] = RowPair(a, a_stride, nb + 8 * j + g, col + 8, rank, f);
      }
#pragma unroll
      for (int mb = 0; mb < 4; ++mb) {
        // A = H's 16 rows by 16 columns: lane l addresses row l % 8 of
        // matrix l / 8 (matrices: rows 0-7 and 8-15 of the first 8
        // columns, then of the next 8), mma.sync's a0-a3 in that order.
        const int matrix = lane / 8;
        const int r = mb * 16 + (matrix & 1) * 8 + lane % 8;
        const int unit = (ks % 4) * 2 + (matrix >> 1);
        const uint32_t address = SmemAddress(chunk + r * 128 + ((unit ^ (r % 8)) * 16));
        uint32_t frag[4];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(frag[0]), "=r"(frag[1]), "=r"(frag[2]), "=r"(frag[3])
                     : "r"(address)
                     : "memory");
        Mma16816(acc[mb][0], frag, b[0][0], b[0][1]);
        Mma16816(acc[mb][1], frag, b[1][0], b[1][1]);
      }
    }
#pragma unroll
    for (int mb = 0; mb < 4; ++mb) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = nb + 8 * j + pair;
        if (col >= rank) continue;
        const int r0 = row0 + mb * 16 + g, r1 = r0 + 8;
        if (r0 < m) RedAdd2(sums + r0 * sums_stride + col, acc[mb][j][0], acc[mb][j][1]);
        if (r1 < m) RedAdd2(sums + r1 * sums_stride + col, acc[mb][j][2], acc[mb][j][3]);
      }
    }
  }
}

// kLoraSums: SwiGLU's backward with LoRA's sums (a kernel of its own: their
// code in the epilogue warps' part costs the plain backward's epilogue its
// registers, measured 1.8 times slower with it in one kernel), or SwiGLU's
// forward with down's LoRA product over h (HRowSums; likewise its own).
template <HopperEpilogue kEpilogue, bool kWTransposed, bool kLoraSums>
__global__ void __launch_bounds__(kThreads, 1) GemmKernel(const __grid_constant__ GemmMaps maps) {
  static_assert(!kLoraSums || kEpilogue == HopperEpilogue::kSwiGluBackward || kEpilogue == HopperEpilogue::kSwiGlu,
                "LoRA's sums are SwiGLU's (its backward's, or down's product over h in its forward)");
  static_assert(!(kWTransposed && kEpilogue == HopperEpilogue::kSwiGlu), "SwiGLU takes W as stored");
  static_assert(kEpilogue != HopperEpilogue::kSwiGluBackward || kWTransposed, "SwiGLU's backward takes W transposed");
  static_assert(!(kWTransposed && kEpilogue == HopperEpilogue::kRope), "the rotary epilogue takes W as stored");
  constexpr bool kBackward = kEpilogue == HopperEpilogue::kSwiGluBackward;
  constexpr bool kRope = kEpilogue == HopperEpilogue::kRope;
  // setmaxnreg moves registers between the block's own warpgroups: what the
  // producer gives up is all the consumers can take, out of the launch's
  // kLaunchRegisters a thread (not the SM's 65,536: a split that needs more
  // leaves the consumers waiting in setmaxnreg.inc for ever). The backward's
  // epilogue warps hold HG_BACKWARD_UNITS units' operands in flight; the
  // rotary's hold two units and their angles.
  // With LoRA's sums, HG_LORA_REGISTERS (the backward's) or
  // HG_LORA_FORWARD_REGISTERS (the forward's) for the producer's warpgroup
  // and the rest, a multiple of 8, for the consumers'.
  constexpr int kProducerRegisters = kLoraSums ? (kBackward ? HG_LORA_REGISTERS : HG_LORA_FORWARD_REGISTERS)
                                     : kBackward ? (HG_BACKWARD_UNITS > 2 ? 112 : 72)
                                     : kRope     ? 72
                                                 : 40;
  constexpr int kConsumerRegisters =
      kLoraSums ? (kThreads * kLaunchRegisters - 128 * kProducerRegisters) / 256 / 8 * 8
      : kBackward ? (HG_BACKWARD_UNITS > 2 ? 192 : 216)
      : kRope     ? 216
                  : 232;
  static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= kThreads * kLaunchRegisters,
                "the warpgroups' registers over the launch's");
  extern __shared__ uint8_t raw_smem[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw_smem) + 1023) & ~uintptr_t{1023});
  uint8_t* a_smem = smem;
  uint8_t* b_smem = a_smem + kStages * kABytes;
  uint8_t* chunk_smem = b_smem + kStages * kBBytes;  // the hand-over buffer
  // SwiGLU's backward by TMA or with LoRA's sums: [gate chunk | up chunk] (with the sums, then [dup | h]).
  uint8_t* staging = chunk_smem + kHandOverBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(staging + (Stages<kEpilogue, kLoraSums>() ? kStagingBytes : 0));
  uint64_t* empty = full + kStages;
  // The hand-over: `ready` completes a phase when both consumers have
  // written a tile into the buffer, `released` when its stores have read it.
  uint64_t* ready = empty + kStages;
  uint64_t* released = ready + 1;
  uint64_t* staged = released + 1;  // SwiGLU's backward by TMA: a chunk of gate and up arrived

  const int warpgroup = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      BarrierInit(&full[s], 1);
      BarrierInit(&empty[s], 2 * 4);  // one arrival per warp that reads the stage
    }
    BarrierInit(ready, 256);  // every consumer thread, after its own writes
    // SwiGLU's backward: every epilogue thread, after its reads.
    BarrierInit(released, kBackward ? 96 : 1);
    BarrierInit(staged, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  const int tiles = maps.tiles_m * maps.tiles_n;
  if (warpgroup == 0) {
    // The producer: one thread issues every load.
    LowerRegisters<kProducerRegisters>();
    if (tid >= 32) {
      // Warps 1-3: the epilogue of each tile the consumers hand over.
      const int w = tid - 32;
      if (kEpilogue == HopperEpilogue::kPlain && w != 0) return;  // the rotary's warps all work
      auto chunk = [&](int c, int half) { return chunk_smem + (2 * c + half) * kChunkBytes; };
      int n = 0;
      [[maybe_unused]] int staged_count = 0;  // chunks staged so far (SwiGLU's backward by TMA, LoRA's sums)
      // SwiGLU's backward by TMA: gate's and up's 64 x 64 chunk at (row, col) into the staging area.
      [[maybe_unused]] auto load_staged = [&](int row_c, int col) {
        BarrierExpectBytes(staged, 2 * kChunkBytes);
        TmaLoad(staging, &maps.gate, col, row_c, staged);
        TmaLoad(staging + kChunkBytes, &maps.up, col, row_c, staged);
      };
      for (int t = blockIdx.x; t < tiles; t += gridDim.x, ++n) {
        const TileCoordinates tile = Tile(t, maps.tiles_m, maps.tiles_n);
        const int row = tile.m * kBlockM;
        // SwiGLU's backward by TMA: gate's and up's first chunk do not wait for dh.
        if (kBackward && (HG_BACKWARD_TMA || kLoraSums) && w == 0) {
          load_staged(row, tile.n * kBlockN);
        }
        BarrierWait(ready, n & 1);
        if (kRope && tile.n * kBlockN < maps.rotate_columns) {
          // The tile's heads p = 0, 1 (128 columns each) are column blocks
          // 2 p (the first half) and 2 p + 1 (the second): an element and its
          // partner sit at the same offset of their chunks (same swizzle), and
          // unit u of row r holds the head's columns 8 (u ^ (r % 8)) .. + 7.
          // Both heads share a row's angles; a head at or past rotate_columns
          // (v's) stays as it is.
          const bool second = tile.n * kBlockN + 128 < maps.rotate_columns;
          for (int q = w; q < 2 * 64 * 8; q += 96) {
            const int half = q / 512, r = (q / 8) % 64, u = q % 8;
            const int at_row = row + half * 64 + r;
            const float position = at_row < maps.m ? static_cast<float>(__ldg(maps.positions + at_row)) : 0.f;
            const int offset = r * 128 + u * 16, i0 = (u ^ (r % 8)) * 8;
            for (int p = 0; p < (second ? 2 : 1); ++p) {
              uint4* a = reinterpret_cast<uint4*>(chunk(2 * p, half) + offset);
              uint4* b = reinterpret_cast<uint4*>(chunk(2 * p + 1, half) + offset);
              uint4 va = *a, vb = *b;
              Rotate8(va, vb, position, maps.inv_freq, i0);
              *a = va;
              *b = vb;
            }
          }
          FenceAsyncShared();
          NamedBarrier(3, 96);
        }
        if (kEpilogue == HopperEpilogue::kPlain || kRope) {
          if (kRope && w != 0) continue;
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            for (int half = 0; half < 2; ++half) {
              TmaStoreUncommitted(&maps.d, chunk(c, half), tile.n * kBlockN + c * kChunk, row + half * 64);
            }
          }
          TmaStoreCommit();
          TmaStoreWaitRead<0>();
          BarrierArrive(released);
          continue;
        }
        if (kBackward && (HG_BACKWARD_TMA || kLoraSums)) {
          // SwiGLU's backward by TMA (that build, or with LoRA's sums),
          // chunk by chunk (64 rows x 64 columns of dh; one swizzle, so a
          // 16-byte unit sits at the same offset in the chunk of dh and the
          // staging area's two): gate and up loaded into the staging area,
          // dgate written over dh, dup over gate (with LoRA's sums, h over
          // up); dgate and dup stored by TMA, and their reads waited for
          // before the next chunk's loads. With LoRA's sums, warp e adds its
          // sum over the chunk's rows while they are stored (ChunkSums): e =
          // 0 t_gate^T dgate, 1 t_up^T dup, 2 u^T h. Outside the product dh
          // is zero and TMA's loads read zeros, so dgate, dup and h are
          // zeros there, as the sums need.
          const int e = w / 32;
          [[maybe_unused]] const LoraSum sum = kLoraSums ? LoraSumOfWarp(maps, e) : LoraSum{};
          const uint8_t* operand = staging + (e == 1 ? 0 : kChunkBytes);  // dup's or h's (dgate's: the chunk)
#pragma unroll 1
          for (int chunk_index = 0; chunk_index < 8; ++chunk_index, ++staged_count) {
            const int c = chunk_index / 2, half = chunk_index % 2;
            const int row0 = row + half * 64, col0 = tile.n * kBlockN + c * kChunk;
            uint8_t* dgate_chunk = chunk(c, half);
            if (w == 0 && chunk_index > 0) load_staged(row0, col0);
            // This warp's thin operand's first fragments, loaded while the chunk comes.
            uint32_t first[4][4];
            if (kLoraSums && sum.rank > 0) {
              ThinFragments(first, sum.thin, sum.thin_stride, sum.rank, maps.m, row0, 0, w % 32);
            }
            BarrierWait(staged, staged_count & 1);
#pragma unroll 1
            for (int q = w; q < kChunkBytes / 16; q += 96) {
              uint4* dh = reinterpret_cast<uint4*>(dgate_chunk) + q;
              uint4* g = reinterpret_cast<uint4*>(staging) + q;
              uint4* u = reinterpret_cast<uint4*>(staging + kChunkBytes) + q;
              const uint4 gate = *g, up = *u;
              uint4 dg, du;
              SwiGluBackward8(*dh, gate, up, dg, du);
              *dh = dg;
              *g = du;
              if (kLoraSums) *u = SwiGlu8(gate, up);
            }
            FenceAsyncShared();
            NamedBarrier(3, 96);
            if (w == 0) {
              TmaStoreUncommitted(&maps.d, dgate_chunk, col0, row0);
              TmaStoreUncommitted(&maps.d_up, staging, col0, row0);
              TmaStoreCommit();
            }
            if (kLoraSums && sum.rank > 0) {
              ChunkSums(first, sum.thin, sum.thin_stride, sum.rank, sum.sums, maps.n, maps.m,
                        e == 0 ? dgate_chunk : operand, row0, col0, w % 32);
            }
            if (w == 0) TmaStoreWaitRead<0>();
            NamedBarrier(3, 96);  // the staging area and the chunk read before the next chunk's loads
          }
          BarrierArrive(released);
          continue;
        }
        if (kBackward) {
          // 16-byte unit q of dh: consecutive threads along a row (eight
          // units a row of a 64-column block), so that gate|up's reads and
          // dgate|dup's writes are whole 128-byte lines; kInFlight units at a time.
          auto unit = [&](int q, int& at_row, int& at_col) -> const uint4* {
            const int u = q % 8, r = (q / 8) % 64, half = (q / 512) % 2, c = q / 1024;
            at_row = row + half * 64 + r;
            at_col = tile.n * kBlockN + c * 64 + u * 8;
            return reinterpret_cast<const uint4*>(chunk(c, half) + r * 128 + ((u ^ (r % 8)) * 16));
          };
          constexpr int kUnits = 4 * 2 * 64 * 8;  // the tile's 64 KB
          constexpr int kInFlight = HG_BACKWARD_UNITS;
          for (int q = w; q < kUnits; q += kInFlight * 96) {
            int rows[kInFlight], cols[kInFlight];
            uint4 dh[kInFlight], g[kInFlight], u[kInFlight];
            bool in[kInFlight];
#pragma unroll
            for (int i = 0; i < kInFlight; ++i) {
              in[i] = false;
              if (q + i * 96 >= kUnits) continue;
              const uint4* d = unit(q + i * 96, rows[i], cols[i]);
              in[i] = rows[i] < maps.m && cols[i] < maps.n;
              if (in[i]) {
                dh[i] = *d;
                const __nv_bfloat16* p = maps.gate_up + rows[i] * maps.gate_up_stride + cols[i];
                g[i] = __ldg(reinterpret_cast<const uint4*>(p));
                u[i] = __ldg(reinterpret_cast<const uint4*>(p + maps.n));
              }
            }
#pragma unroll
            for (int i = 0; i < kInFlight; ++i) {
              if (!in[i]) continue;
              uint4 dg, du;
              SwiGluBackward8(dh[i], g[i], u[i], dg, du);
              __nv_bfloat16* p = maps.grad + rows[i] * maps.grad_stride + cols[i];
              *reinterpret_cast<uint4*>(p) = dg;
              *reinterpret_cast<uint4*>(p + maps.n) = du;
            }
          }
          BarrierArrive(released);
          continue;
        }
        // SwiGLU: column blocks 0, 1 gate's, 2, 3 up's. Gate and up stored,
        // h = silu(gate) * up written over gate's blocks (same swizzle, so
        // 16-byte unit q of up's half matches unit q of gate's), then stored.
        const int col = tile.n * (kBlockN / 2);
        if (w == 0) {
          for (int c = 0; c < 2; ++c) {
            for (int half = 0; half < 2; ++half) {
              TmaStoreUncommitted(&maps.d, chunk(c, half), col + c * kChunk, row + half * 64);
              TmaStoreUncommitted(&maps.d_up, chunk(2 + c, half), col + c * kChunk, row + half * 64);
            }
          }
          TmaStoreCommit();
          TmaStoreWaitRead<0>();
        }
        NamedBarrier(3, 96);
        constexpr int kUnits = 2 * kChunkBytes * 2 / 16;  // gate's 32 KB in 16-byte units
        for (int q = w; q < kUnits; q += 96) {
          uint4* gate = reinterpret_cast<uint4*>(chunk_smem) + q;
          *gate = SwiGlu8(*gate, *(reinterpret_cast<const uint4*>(chunk_smem + 2 * 2 * kChunkBytes) + q));
        }
        FenceAsyncShared();
        NamedBarrier(3, 96);
        if (w == 0) {
          for (int c = 0; c < 2; ++c) {
            for (int half = 0; half < 2; ++half) {
              TmaStoreUncommitted(&maps.h, chunk(c, half), col + c * kChunk, row + half * 64);
            }
          }
          TmaStoreCommit();
        }
        if (kLoraSums) {
          // Down's LoRA product over h while it is stored: warp 1 over the
          // tile's first 64 rows, warp 2 over the next; the buffer goes back
          // once both have read it.
          if (w >= 32) {
            const int half = w / 32 - 1;
            HRowSums(chunk(0, half), chunk(1, half), maps.lora_a, maps.lora_a_stride, maps.rank_h, maps.n / 2,
                     maps.lora_h_sums, maps.lora_h_sums_stride, maps.m, row + half * 64, col, w % 32);
          }
          NamedBarrier(3, 96);
        }
        if (w == 0) {
          TmaStoreWaitRead<0>();
          BarrierArrive(released);
        }
      }
      if (w == 0) TmaStoreWaitAll();
      return;
    }
    if (tid != 0) return;
    int it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const TileCoordinates tile = Tile(t, maps.tiles_m, maps.tiles_n);
      if (kBackward && HG_BACKWARD_PREFETCH) {
        // The tile's gate and up (64 x 64 boxes), for its epilogue.
        for (int c = 0; c < 4; ++c) {
          for (int half = 0; half < 2; ++half) {
            TmaPrefetchL2(&maps.gate, tile.n * kBlockN + c * kChunk, tile.m * kBlockM + half * 64);
            TmaPrefetchL2(&maps.up, tile.n * kBlockN + c * kChunk, tile.m * kBlockM + half * 64);
          }
        }
      }
      for (int kt = 0; kt < maps.k_tiles; ++kt, ++it) {
        const int s = it % kStages;
        BarrierWait(&empty[s], ((it / kStages) & 1) ^ 1);
        BarrierExpectBytes(&full[s], kABytes + kBBytes);
        const int k = kt * kBlockK;
        uint8_t* b = b_smem + s * kBBytes;
        TmaLoad(a_smem + s * kABytes, &maps.x, k, tile.m * kBlockM, &full[s]);
        if (kWTransposed) {
#pragma unroll
          for (int j = 0; j < kBlockN / 64; ++j) {
            TmaLoad(b + j * kBoxBytes, &maps.w, tile.n * kBlockN + 64 * j, k, &full[s]);
          }
        } else if (kEpilogue == HopperEpilogue::kSwiGlu) {
          // The tile's gate rows, then the same rows of up.
          TmaLoad(b, &maps.w, k, tile.n * (kBlockN / 2), &full[s]);
          TmaLoad(b + kBBytes / 2, &maps.w_up, k, tile.n * (kBlockN / 2), &full[s]);
        } else {
          TmaLoad(b, &maps.w, k, tile.n * kBlockN, &full[s]);
        }
      }
    }
    return;
  }

  // The consumers: rows 64 * consumer .. + 63 of each tile.
  RaiseRegisters<kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const int warp = tid / 32, lane = tid % 32;
  float acc[128];
  int it = 0;
  int handed_over = 0;  // tiles handed over so far
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    int previous = -1;
    for (int kt = 0; kt < maps.k_tiles; ++kt, ++it) {
      const int s = it % kStages;
      BarrierWait(&full[s], (it / kStages) & 1);
      const uint32_t a = SmemAddress(a_smem + s * kABytes + consumer * (kABytes / 2));
      const uint32_t b = SmemAddress(b_smem + s * kBBytes);
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        if (kWTransposed) {
          Wgmma256<1>(acc, DescriptorK(a + kk * 32), DescriptorMN(b + kk * 2048), kt > 0 || kk > 0);
        } else {
          Wgmma256<0>(acc, DescriptorK(a + kk * 32), DescriptorK(b + kk * 32), kt > 0 || kk > 0);
        }
      }
      WgmmaCommit();
      WgmmaWait<1>();  // the previous k-slice's products are done: release its stage
      if (previous >= 0 && lane == 0) BarrierArrive(&empty[previous]);
      previous = s;
    }
    WgmmaWait<0>();
    if (lane == 0) BarrierArrive(&empty[previous]);

    // Hand the tile over: wait until the previous tile's stores have read
    // the buffer, write this one's chunks (rounded to bf16), mark them written.
    auto plain = [&](int i, int e) { return acc[4 * i + e]; };
    if (handed_over > 0) BarrierWait(released, (handed_over - 1) & 1);
#pragma unroll
    for (int c = 0; c < 4; ++c) WriteChunk(chunk_smem + (2 * c + consumer) * kChunkBytes, warp, lane, 8 * c, plain);
    FenceAsyncShared();
    BarrierArrive(ready);
    ++handed_over;
  }
}

// ---- host ----

template <HopperEpilogue kEpilogue, bool kWTransposed, bool kLoraSums = false>
std::string Launch(const GemmMaps& maps, int grid, cudaStream_t stream) {
  constexpr int kSmemBytes = SmemBytes<kEpilogue, kLoraSums>();
  const std::string why = AllowSharedMemory<GemmKernel<kEpilogue, kWTransposed, kLoraSums>>(kSmemBytes);
  if (!why.empty()) return "HopperGemm: " + why;
  GemmKernel<kEpilogue, kWTransposed, kLoraSums><<<grid, kThreads, kSmemBytes, stream>>>(maps);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("HopperGemm: launch failed: ") + cudaGetErrorString(e);
}

}  // namespace

std::string HopperGemmBuild() {
  const std::string backward = (HG_BACKWARD_TMA ? "by TMA" : std::to_string(HG_BACKWARD_UNITS) + " units in flight") +
                               std::string(HG_BACKWARD_PREFETCH ? ", gate and up prefetched to L2" : "") +
                               "; with LoRA's sums by TMA, " + std::to_string(HG_LORA_REGISTERS) + " registers";
  return "cooperative 128 x 256, epilogue by the producer's warps (SwiGLU's backward " + backward + ")" +
         ", stages " + std::to_string(kStages) + ", group " + std::to_string(HG_GROUP) + ", fast silu " +
         std::to_string(HG_FAST_SILU) + ", " + std::to_string(SmemBytes<HopperEpilogue::kPlain, false>()) +
         " bytes of shared memory a block (" + std::to_string(SmemBytes<HopperEpilogue::kSwiGluBackward, true>()) +
         " for SwiGLU's backward with LoRA's sums)";
}

bool CurrentDeviceIsHopper() { return CurrentDevice().hopper; }

bool HopperGemmSuits(int64_t m, int64_t n, int64_t k) {
  const DeviceInfo device = CurrentDevice();
  const int64_t tiles = ((m + kBlockM - 1) / kBlockM) * ((n + kBlockN - 1) / kBlockN);
  return device.hopper && device.sms > 0 && k >= 256 && tiles >= device.sms;
}

std::string HopperGemm(const HopperGemmOperands& o, HopperEpilogue epilogue, void* stream) {
  const DeviceInfo device = CurrentDevice();
  if (!device.hopper) return "HopperGemm: the current device is not a Hopper GPU (compute capability 9.0)";
  const bool swiglu = epilogue == HopperEpilogue::kSwiGlu;
  const bool backward = epilogue == HopperEpilogue::kSwiGluBackward;
  if (backward && (!o.w_transposed || o.n % 8 != 0 || o.gate_up == nullptr || !Aligned(o.gate_up) ||
                   o.gate_up_stride % 8 != 0 || o.gate_up_stride < 2 * o.n || o.d_stride < 2 * o.n)) {
    return "HopperGemm: SwiGLU's backward needs W transposed, n a multiple of 8, and gate|up and D of 2 n columns, "
           "16-byte aligned";
  }
  const bool lora_b = o.lora_b_sums != nullptr, lora_a = o.lora_a_sums != nullptr;
  const bool lora_h = o.lora_h_sums != nullptr;
  if ((lora_b || lora_a) && !backward) {
    return "HopperGemm: LoRA's B and A sums are SwiGLU's backward's";
  }
  if (lora_h && !swiglu) return "HopperGemm: down's LoRA product over h is SwiGLU's forward's";
  if (lora_h && (o.lora_a == nullptr || o.rank_h <= 0 || o.rank_h > 256 || o.lora_a_stride < o.n / 2 ||
                 o.lora_a_stride % 2 != 0 || reinterpret_cast<uintptr_t>(o.lora_a) % 4 != 0 ||
                 o.lora_h_sums_stride < o.rank_h || o.lora_h_sums_stride % 2 != 0 ||
                 reinterpret_cast<uintptr_t>(o.lora_h_sums) % 8 != 0)) {
    return "HopperGemm: down's LoRA product over h needs a of a rank of 1-256, its stride at least n / 2 and even, "
           "4-byte aligned, and 8-byte aligned sums rows of an even stride at least the rank";
  }
  if (lora_b && (o.lora_t == nullptr || o.rank_gate < 0 || o.rank_up < 0 || o.rank_gate + o.rank_up == 0 ||
                 o.rank_gate > 256 || o.rank_up > 256 || o.lora_t_stride < o.rank_gate + o.rank_up ||
                 reinterpret_cast<uintptr_t>(o.lora_b_sums) % 8 != 0)) {
    return "HopperGemm: LoRA's B sums need t, ranks 0-256 (not both 0), t's stride at least their sum, and "
           "8-byte aligned sums";
  }
  if (lora_a && (o.lora_u == nullptr || o.rank_h <= 0 || o.rank_h > 256 || o.lora_u_stride < o.rank_h ||
                 reinterpret_cast<uintptr_t>(o.lora_a_sums) % 8 != 0)) {
    return "HopperGemm: LoRA's A sums need u, a rank of 1-256, u's stride at least it, and 8-byte aligned sums";
  }
  if (o.m <= 0 || o.n <= 0 || o.k <= 0) return "HopperGemm: empty product";
  if (o.m >= (int64_t{1} << 31) || o.n >= (int64_t{1} << 31) || o.k >= (int64_t{1} << 31)) {
    return "HopperGemm: a dimension over 2^31";
  }
  if (swiglu && (o.w_transposed || o.n % 16 != 0 || o.h == nullptr)) {
    return "HopperGemm: SwiGLU's epilogue needs W as stored, n a multiple of 16 and H";
  }
  const bool rope = epilogue == HopperEpilogue::kRope;
  if (rope && (o.w_transposed || o.rotate_columns <= 0 || o.rotate_columns % 128 != 0 || o.rotate_columns > o.n ||
               o.positions == nullptr || o.inv_freq == nullptr)) {
    return "HopperGemm: the rotary epilogue needs W as stored, rotate_columns a multiple of 128 up to n, "
           "positions and inv_freq";
  }
  const int64_t w_cols = o.w_transposed ? o.n : o.k;
  const int64_t h_cols = swiglu ? o.n / 2 : 0;
  if (!Aligned(o.x) || !Aligned(o.w) || !Aligned(o.d) || (swiglu && !Aligned(o.h)) || o.x_stride % 8 != 0 ||
      o.w_stride % 8 != 0 || o.d_stride % 8 != 0 || (swiglu && o.h_stride % 8 != 0) || o.x_stride < o.k ||
      o.w_stride < w_cols || o.d_stride < o.n || (swiglu && o.h_stride < h_cols)) {
    return "HopperGemm: pointers must be 16-byte aligned and row strides multiples of 8 elements, at least a row";
  }
  GemmMaps maps{};
  std::string why = Map(&maps.x, o.x, o.m, o.k, o.x_stride, kBlockM);
  maps.k_tiles = static_cast<int>((o.k + kBlockK - 1) / kBlockK);
  maps.tiles_m = static_cast<int>((o.m + kBlockM - 1) / kBlockM);
  if (swiglu) {
    const int64_t f = o.n / 2;
    const auto* w = static_cast<const __nv_bfloat16*>(o.w);
    auto* d = static_cast<__nv_bfloat16*>(o.d);
    if (why.empty()) why = Map(&maps.w, w, f, o.k, o.w_stride, kBlockN / 2);
    if (why.empty()) why = Map(&maps.w_up, w + f * o.w_stride, f, o.k, o.w_stride, kBlockN / 2);
    if (why.empty()) why = Map(&maps.d, d, o.m, f, o.d_stride, kChunk);
    if (why.empty()) why = Map(&maps.d_up, d + f, o.m, f, o.d_stride, kChunk);
    if (why.empty()) why = Map(&maps.h, o.h, o.m, f, o.h_stride, kChunk);
    maps.tiles_n = static_cast<int>((f + kBlockN / 2 - 1) / (kBlockN / 2));
  } else {
    if (why.empty()) {
      why = o.w_transposed ? Map(&maps.w, o.w, o.k, o.n, o.w_stride, 64)
                           : Map(&maps.w, o.w, o.n, o.k, o.w_stride, kBlockN);
    }
    if (why.empty()) why = Map(&maps.d, o.d, o.m, o.n, o.d_stride, kChunk);
    if (why.empty() && backward) {
      // SwiGLU's backward: D is [dgate | dup] (m, 2 n), maps.d its dgate
      // half; gate and up of the forward's [gate | up] (by TMA in that build).
      const auto* gate_up = static_cast<const __nv_bfloat16*>(o.gate_up);
      why = Map(&maps.d_up, static_cast<const __nv_bfloat16*>(o.d) + o.n, o.m, o.n, o.d_stride, kChunk);
      if (why.empty()) why = Map(&maps.gate, gate_up, o.m, o.n, o.gate_up_stride, kChunk);
      if (why.empty()) why = Map(&maps.up, gate_up + o.n, o.m, o.n, o.gate_up_stride, kChunk);
    }
    maps.tiles_n = static_cast<int>((o.n + kBlockN - 1) / kBlockN);
  }
  if (!why.empty()) return "HopperGemm: " + why;
  maps.gate_up = static_cast<const __nv_bfloat16*>(o.gate_up);
  maps.grad = static_cast<__nv_bfloat16*>(o.d);
  maps.gate_up_stride = o.gate_up_stride;
  maps.grad_stride = o.d_stride;
  maps.m = static_cast<int>(o.m);
  maps.n = static_cast<int>(o.n);
  maps.positions = o.positions;
  maps.inv_freq = o.inv_freq;
  maps.rotate_columns = static_cast<int>(o.rotate_columns);
  maps.lora_t = static_cast<const __nv_bfloat16*>(o.lora_t);
  maps.lora_u = static_cast<const __nv_bfloat16*>(o.lora_u);
  maps.lora_t_stride = o.lora_t_stride;
  maps.lora_u_stride = o.lora_u_stride;
  maps.rank_gate = lora_b ? static_cast<int>(o.rank_gate) : 0;
  maps.rank_up = lora_b ? static_cast<int>(o.rank_up) : 0;
  maps.rank_h = lora_a || lora_h ? static_cast<int>(o.rank_h) : 0;
  maps.lora_b_sums = o.lora_b_sums;
  maps.lora_a_sums = o.lora_a_sums;
  maps.lora_a = static_cast<const __nv_bfloat16*>(o.lora_a);
  maps.lora_a_stride = o.lora_a_stride;
  maps.lora_h_sums = o.lora_h_sums;
  maps.lora_h_sums_stride = o.lora_h_sums_stride;
  const int tiles = maps.tiles_m * maps.tiles_n;
  const int grid = std::min(tiles, device.sms);
  auto* s = static_cast<cudaStream_t>(stream);
  if (lora_b && cudaMemsetAsync(o.lora_b_sums, 0, (o.rank_gate + o.rank_up) * o.n * 4, s) != cudaSuccess) {
    return std::string("HopperGemm: zeroing LoRA's B sums failed: ") + cudaGetErrorString(cudaGetLastError());
  }
  if (lora_a && cudaMemsetAsync(o.lora_a_sums, 0, o.rank_h * o.n * 4, s) != cudaSuccess) {
    return std::string("HopperGemm: zeroing LoRA's A sums failed: ") + cudaGetErrorString(cudaGetLastError());
  }
  if (lora_h && cudaMemsetAsync(o.lora_h_sums, 0, o.m * o.lora_h_sums_stride * 4, s) != cudaSuccess) {
    return std::string("HopperGemm: zeroing down's LoRA sums over h failed: ") + cudaGetErrorString(cudaGetLastError());
  }
  if (swiglu) {
    return lora_h ? Launch<HopperEpilogue::kSwiGlu, false, true>(maps, grid, s)
                  : Launch<HopperEpilogue::kSwiGlu, false>(maps, grid, s);
  }
  if (backward) {
    return lora_b || lora_a ? Launch<HopperEpilogue::kSwiGluBackward, true, true>(maps, grid, s)
                            : Launch<HopperEpilogue::kSwiGluBackward, true>(maps, grid, s);
  }
  if (rope) return Launch<HopperEpilogue::kRope, false>(maps, grid, s);
  return o.w_transposed ? Launch<HopperEpilogue::kPlain, true>(maps, grid, s)
                        : Launch<HopperEpilogue::kPlain, false>(maps, grid, s);
}

}  // namespace trainerd::kernels
