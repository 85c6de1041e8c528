// A Hopper GEMM of our own, D = X W^T in bf16 with float32 accumulation, with
// SwiGLU's forward as an optional epilogue; checked against cuBLAS and timed
// beside it. The question it answers (bench/speed/NOTES.md, "SwiGLU inside
// the GEMMs"): can a kernel of ours run the 8b row's GEMMs as fast as cuBLAS,
// so that the SwiGLU passes can move into its epilogues?
//
// Build and run on the GPU machine (sm_90a: wgmma and setmaxnreg):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo \
//        -o /tmp/hopper_gemm bench/gemm/hopper_gemm.cu -lcublas -lcuda
//   /tmp/hopper_gemm            # every check, then every timing
//   /tmp/hopper_gemm check | time
// Compile-time knobs (-D): HG_STAGES (ring depth, default 4), HG_GROUP (the
// rasterisation's group of 128-row tiles, default 16).
//
// The kernel (persistent, warp-specialised, one 128 x 256 tile at a time per
// block, one block an SM):
//   - warpgroup 0, the producer: one thread issues TMA loads of X's 128 x 64
//     and W's 256 x 64 k-slices (128-byte swizzle) into a ring of HG_STAGES
//     stages, each completing on its `full` mbarrier, and waits on each
//     stage's `empty` mbarrier before reusing it;
//   - warpgroups 1 and 2, the consumers: 64 rows of the tile each, wgmma
//     m64n256k16 from shared memory into 128 float32 registers a thread; a
//     stage is released (one arrival a warp) once the wgmma group after it
//     has been issued and its own has completed;
//   - the epilogue: each consumer warpgroup rounds its 64 x 256 accumulator
//     to bf16 in 64 x 64 chunks, written to a swizzled shared-memory buffer
//     (two a warpgroup, alternating) and stored by TMA while the next chunk is
//     written. Tails in M, N and K are TMA's: loads outside the tensor read
//     zeros, stores outside it are dropped.
// SwiGLU's epilogue (D = [gate | up] of width 2F, H = silu(gate) * up of
// width F): a tile's 256 columns are 128 of gate's and the matching 128 of
// up's, loaded as two 128-row boxes (W's rows j and F + j), so that every
// thread holds both halves of its elements; it writes gate and up back to
// their own columns of D and h to H. gate and up are rounded to bf16 before
// h is made from them, as a SwiGLU pass reading D would.
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

#ifndef HG_STAGES
#define HG_STAGES 4
#endif
#ifndef HG_GROUP
#define HG_GROUP 16
#endif

namespace {

constexpr int kBlockM = 128, kBlockN = 256, kBlockK = 64;
constexpr int kStages = HG_STAGES;
constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
constexpr int kChunk = 64;     // epilogue chunk: 64 rows x 64 columns
constexpr int kABytes = kBlockM * kBlockK * 2;    // 16 KB
constexpr int kBBytes = kBlockN * kBlockK * 2;    // 32 KB
constexpr int kChunkBytes = kChunk * kChunk * 2;  // 8 KB
constexpr int kSmemBytes = kStages * (kABytes + kBBytes) + 2 * 2 * kChunkBytes + 2 * kStages * 8 + 1024;
static_assert(kSmemBytes <= 227 * 1024, "shared memory over the 227 KB a block may have");

enum class Epilogue { kPlain, kSwiGlu };

#define CHECK_CUDA(x)                                                                      \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

// ---- device helpers (PTX) ----

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void BarrierInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddress(bar)), "r"(count));
}

__device__ __forceinline__ void BarrierExpectBytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddress(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void BarrierArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SmemAddress(bar)) : "memory");
}

// Waits until the barrier's phase of the given parity has completed.
__device__ __forceinline__ void BarrierWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(SmemAddress(bar)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void TmaLoad(void* dst, const CUtensorMap* map, int col, int row, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          SmemAddress(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(SmemAddress(bar))
      : "memory");
}

__device__ __forceinline__ void TmaStore(const CUtensorMap* map, const void* src, int col, int row) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(col), "r"(row), "r"(SmemAddress(src))
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most N committed TMA stores still read shared memory.
template <int N>
__device__ __forceinline__ void TmaStoreWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void TmaStoreWaitAll() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

__device__ __forceinline__ void FenceAsyncShared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

template <int kRegisters>
__device__ __forceinline__ void RaiseRegisters() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

template <int kRegisters>
__device__ __forceinline__ void LowerRegisters() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

// A shared-memory matrix descriptor for a K-major operand in 128-byte swizzle
// atoms (8 rows of 64 bf16): start address, leading byte offset (unused for
// this layout), stride byte offset 1024 (between 8-row groups), swizzle mode 1.
__device__ __forceinline__ uint64_t Descriptor(uint32_t smem_address) {
  return static_cast<uint64_t>((smem_address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// d (64 x 256, this thread's 128 values) += A (64 x 16) B (256 x 16)^T, or =
// when accumulate is 0.
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
      "}, %128, %129, p, 1, 1, 0, 0;\n"
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
      : "l"(a), "l"(b), "r"(accumulate));
}

// ---- the kernel ----

struct GemmMaps {
  CUtensorMap x;       // (M, K), box 64 x 128
  CUtensorMap w;       // plain: (N, K), box 64 x 256; SwiGLU: gate's rows (F, K), box 64 x 128
  CUtensorMap w_up;    // SwiGLU: up's rows (F, K), box 64 x 128
  CUtensorMap d;       // plain: (M, N); SwiGLU: D's gate columns (M, F); box 64 x 64
  CUtensorMap d_up;    // SwiGLU: D's up columns (M, F)
  CUtensorMap h;       // SwiGLU: H (M, F)
  int tiles_m, tiles_n, k_tiles;
};

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

__device__ __forceinline__ float Silu(float g) { return g / (1.0f + __expf(-g)); }

// Writes 8 accumulator columns groups (64 columns: groups first .. first + 7)
// of this thread's rows into a swizzled 64 x 64 chunk buffer. value(i, e)
// gives the float for group i, element e (0-3: row r cols c, c+1; row r + 8
// cols c, c+1).
template <typename Value>
__device__ __forceinline__ void WriteChunk(uint8_t* chunk, int warp, int lane, int first, Value value) {
  const int row = 16 * warp + lane / 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int unit = j, within = (lane % 4) * 4;  // column 8j + 2 (lane % 4): byte 16j + 4 (lane % 4)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row + 8 * half;
      const __nv_bfloat162 v = __floats2bfloat162_rn(value(first + j, 2 * half), value(first + j, 2 * half + 1));
      *reinterpret_cast<__nv_bfloat162*>(chunk + r * 128 + ((unit ^ (r % 8)) * 16) + within) = v;
    }
  }
}

template <Epilogue kEpilogue>
__global__ void __launch_bounds__(kThreads, 1) HopperGemm(const __grid_constant__ GemmMaps maps) {
  extern __shared__ uint8_t raw_smem[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw_smem) + 1023) & ~uintptr_t{1023});
  uint8_t* a_smem = smem;
  uint8_t* b_smem = a_smem + kStages * kABytes;
  uint8_t* chunk_smem = b_smem + kStages * kBBytes;  // [consumer][2][kChunkBytes]
  uint64_t* full = reinterpret_cast<uint64_t*>(chunk_smem + 2 * 2 * kChunkBytes);
  uint64_t* empty = full + kStages;

  const int warpgroup = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      BarrierInit(&full[s], 1);
      BarrierInit(&empty[s], 2 * 4);  // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  const int tiles = maps.tiles_m * maps.tiles_n;
  if (warpgroup == 0) {
    LowerRegisters<40>();
    if (tid != 0) return;
    int it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const TileCoordinates tile = Tile(t, maps.tiles_m, maps.tiles_n);
      for (int kt = 0; kt < maps.k_tiles; ++kt, ++it) {
        const int s = it % kStages;
        BarrierWait(&empty[s], ((it / kStages) & 1) ^ 1);
        BarrierExpectBytes(&full[s], kABytes + kBBytes);
        const int k = kt * kBlockK;
        TmaLoad(a_smem + s * kABytes, &maps.x, k, tile.m * kBlockM, &full[s]);
        if (kEpilogue == Epilogue::kPlain) {
          TmaLoad(b_smem + s * kBBytes, &maps.w, k, tile.n * kBlockN, &full[s]);
        } else {
          TmaLoad(b_smem + s * kBBytes, &maps.w, k, tile.n * (kBlockN / 2), &full[s]);
          TmaLoad(b_smem + s * kBBytes + kBBytes / 2, &maps.w_up, k, tile.n * (kBlockN / 2), &full[s]);
        }
      }
    }
    return;
  }

  RaiseRegisters<232>();
  const int consumer = warpgroup - 1;
  const int warp = tid / 32, lane = tid % 32;
  uint8_t* chunks = chunk_smem + consumer * 2 * kChunkBytes;
  float acc[128];
  int it = 0, chunk_count = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const TileCoordinates tile = Tile(t, maps.tiles_m, maps.tiles_n);
    int previous = -1;
    for (int kt = 0; kt < maps.k_tiles; ++kt, ++it) {
      const int s = it % kStages;
      BarrierWait(&full[s], (it / kStages) & 1);
      const uint32_t a = SmemAddress(a_smem + s * kABytes + consumer * (kABytes / 2));
      const uint32_t b = SmemAddress(b_smem + s * kBBytes);
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        Wgmma256(acc, Descriptor(a + kk * 32), Descriptor(b + kk * 32), kt > 0 || kk > 0);
      }
      WgmmaCommit();
      WgmmaWait<1>();  // the previous k-slice's products are done: release its stage
      if (previous >= 0 && lane == 0) BarrierArrive(&empty[previous]);
      previous = s;
    }
    WgmmaWait<0>();
    if (lane == 0) BarrierArrive(&empty[previous]);

    // Epilogue: 64-column chunks through the two buffers, stored by TMA.
    const int row0 = tile.m * kBlockM + consumer * 64;
    auto store = [&](const CUtensorMap* map, int col, auto value, int first) {
      uint8_t* chunk = chunks + (chunk_count % 2) * kChunkBytes;
      if (tid == 0) TmaStoreWaitRead<1>();  // the store that last read this buffer is done with it
      NamedBarrier(1 + consumer, 128);
      WriteChunk(chunk, warp, lane, first, value);
      FenceAsyncShared();
      NamedBarrier(1 + consumer, 128);
      if (tid == 0) TmaStore(map, chunk, col, row0);
      ++chunk_count;
    };
    auto plain = [&](int i, int e) { return acc[4 * i + e]; };
    if (kEpilogue == Epilogue::kPlain) {
#pragma unroll
      for (int c = 0; c < kBlockN / kChunk; ++c) store(&maps.d, tile.n * kBlockN + c * kChunk, plain, 8 * c);
    } else {
      // Groups 0-15 are gate's 128 columns, 16-31 up's matching ones.
      auto h = [&](int i, int e) {
        const float g = __bfloat162float(__float2bfloat16_rn(acc[4 * i + e]));
        const float u = __bfloat162float(__float2bfloat16_rn(acc[4 * (i + 16) + e]));
        return Silu(g) * u;
      };
      const int col = tile.n * (kBlockN / 2);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        store(&maps.d, col + c * kChunk, plain, 8 * c);
        store(&maps.d_up, col + c * kChunk, plain, 16 + 8 * c);
        store(&maps.h, col + c * kChunk, h, 8 * c);
      }
    }
  }
  if (tid == 0) TmaStoreWaitAll();
}

// ---- host: tensor maps, launch, checks, timings ----

// A 2-D bf16 map over rows x cols (row stride ld elements), box box_rows x
// box_cols, 128-byte swizzle (box_cols * 2 must be 128).
CUtensorMap Map(const void* base, int64_t rows, int64_t cols, int64_t ld, int box_rows, int box_cols) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld * 2)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides,
                               box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed (%d): %lld x %lld, ld %lld, box %d x %d\n",
                 static_cast<int>(r), static_cast<long long>(rows), static_cast<long long>(cols),
                 static_cast<long long>(ld), box_rows, box_cols);
    std::exit(1);
  }
  return map;
}

int SmCount() {
  int device = 0, sms = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// D (M, N) = X (M, K) W (N, K)^T, all row-major and dense. SwiGLU: N = 2F
// (W's rows [gate ; up], D's columns [gate | up]), H (M, F).
void Launch(Epilogue epilogue, const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* d, __nv_bfloat16* h,
            int m, int n, int k, cudaStream_t stream) {
  GemmMaps maps{};
  maps.x = Map(x, m, k, k, kBlockM, kBlockK);
  maps.k_tiles = (k + kBlockK - 1) / kBlockK;
  maps.tiles_m = (m + kBlockM - 1) / kBlockM;
  if (epilogue == Epilogue::kPlain) {
    maps.w = Map(w, n, k, k, kBlockN, kBlockK);
    maps.d = Map(d, m, n, n, kChunk, kChunk);
    maps.tiles_n = (n + kBlockN - 1) / kBlockN;
  } else {
    const int f = n / 2;
    maps.w = Map(w, f, k, k, kBlockN / 2, kBlockK);
    maps.w_up = Map(w + static_cast<int64_t>(f) * k, f, k, k, kBlockN / 2, kBlockK);
    maps.d = Map(d, m, f, n, kChunk, kChunk);
    maps.d_up = Map(d + f, m, f, n, kChunk, kChunk);
    maps.h = Map(h, m, f, f, kChunk, kChunk);
    maps.tiles_n = (f + kBlockN / 2 - 1) / (kBlockN / 2);
  }
  const int tiles = maps.tiles_m * maps.tiles_n;
  const int grid = std::min(tiles, SmCount());
  if (epilogue == Epilogue::kPlain) {
    static bool configured = false;
    if (!configured) {
      CHECK_CUDA(cudaFuncSetAttribute(HopperGemm<Epilogue::kPlain>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      kSmemBytes));
      configured = true;
    }
    HopperGemm<Epilogue::kPlain><<<grid, kThreads, kSmemBytes, stream>>>(maps);
  } else {
    static bool configured = false;
    if (!configured) {
      CHECK_CUDA(cudaFuncSetAttribute(HopperGemm<Epilogue::kSwiGlu>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      kSmemBytes));
      configured = true;
    }
    HopperGemm<Epilogue::kSwiGlu><<<grid, kThreads, kSmemBytes, stream>>>(maps);
  }
  CHECK_CUDA(cudaGetLastError());
}

// The reference GEMM: cuBLAS's D = X W^T (row-major).
void CublasGemm(cublasHandle_t handle, const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* d, int m,
                int n, int k) {
  const float one = 1.0f, zero = 0.0f;
  // Column-major view: D^T (N, M) = W (N, K as K x N col-major, transposed) X^T.
  const cublasStatus_t s = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, CUDA_R_16BF, k, x,
                                        CUDA_R_16BF, k, &zero, d, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasGemmEx failed: %d\n", static_cast<int>(s));
    std::exit(1);
  }
}

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

struct Buffers {
  __nv_bfloat16 *x = nullptr, *w = nullptr, *d = nullptr, *h = nullptr, *d_ref = nullptr, *h_ref = nullptr;
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
Buffers Allocate(int m, int n, int k, bool swiglu, uint32_t seed, bool on_device = false) {
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
  CHECK_CUDA(cudaMalloc(&b.d, static_cast<size_t>(m) * n * 2));
  CHECK_CUDA(cudaMalloc(&b.d_ref, static_cast<size_t>(m) * n * 2));
  if (swiglu) {
    CHECK_CUDA(cudaMalloc(&b.h, static_cast<size_t>(m) * (n / 2) * 2));
    CHECK_CUDA(cudaMalloc(&b.h_ref, static_cast<size_t>(m) * (n / 2) * 2));
  }
  return b;
}

void Free(Buffers& b) {
  for (__nv_bfloat16* p : {b.x, b.w, b.d, b.h, b.d_ref, b.h_ref}) {
    if (p != nullptr) CHECK_CUDA(cudaFree(p));
  }
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

bool Check(Epilogue epilogue, int m, int n, int k) {
  const bool swiglu = epilogue == Epilogue::kSwiGlu;
  Buffers b = Allocate(m, n, k, swiglu, 1234u + m + n + k);
  cublasHandle_t handle;
  cublasCreate(&handle);
  CHECK_CUDA(cudaMemset(b.d, 0xFF, static_cast<size_t>(m) * n * 2));  // NaNs where nothing is written
  if (swiglu) CHECK_CUDA(cudaMemset(b.h, 0xFF, static_cast<size_t>(m) * (n / 2) * 2));
  Launch(epilogue, b.x, b.w, b.d, b.h, m, n, k, nullptr);
  CublasGemm(handle, b.x, b.w, b.d_ref, m, n, k);
  if (swiglu) SwiGluReference(b.d_ref, b.h_ref, m, n, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<float> d = Download(b.d, static_cast<size_t>(m) * n);
  const Comparison cd = Compare(d, Download(b.d_ref, static_cast<size_t>(m) * n));
  const double sampled = SampledError(b, d, m, n, k);
  bool ok = !cd.nan && cd.worst_relative < 1e-2 && cd.share_off < 1e-3 && sampled < 1e-2;
  std::printf("check %-6s %5d x %5d x %5d: D worst %.2e of max, %.4f%% off by > 2 ulp, float64 samples %.2e%s",
              swiglu ? "swiglu" : "plain", m, n, k, cd.worst_relative, 100 * cd.share_off, sampled,
              cd.nan ? ", NaN" : "");
  if (swiglu) {
    const size_t count = static_cast<size_t>(m) * (n / 2);
    const Comparison ch = Compare(Download(b.h, count), Download(b.h_ref, count));
    ok = ok && !ch.nan && ch.worst_relative < 1e-2 && ch.share_off < 1e-3;
    std::printf("; H worst %.2e, %.4f%% off%s", ch.worst_relative, 100 * ch.share_off, ch.nan ? ", NaN" : "");
  }
  std::printf(" %s\n", ok ? "ok" : "FAILED");
  cublasDestroy(handle);
  Free(b);
  return ok;
}

// Milliseconds a launch: ours, cuBLAS's GEMM, and (SwiGLU) the pass after it,
// alternating in rounds so that all see the same clocks (the card runs GEMMs
// at its power limit).
void Time(const char* name, Epilogue epilogue, int m, int n, int k) {
  const bool swiglu = epilogue == Epilogue::kSwiGlu;
  Buffers b = Allocate(m, n, k, swiglu, 99u, /*on_device=*/true);
  cublasHandle_t handle;
  cublasCreate(&handle);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cublasSetStream(handle, stream);
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  constexpr int kRounds = 5, kReps = 20;
  const int contestants = swiglu ? 3 : 2;
  double ms_each[3] = {0, 0, 0};
  for (int round = -1; round < kRounds; ++round) {  // round -1 warms up
    for (int who = 0; who < contestants; ++who) {
      CHECK_CUDA(cudaEventRecord(start, stream));
      for (int r = 0; r < kReps; ++r) {
        if (who == 0) Launch(epilogue, b.x, b.w, b.d, b.h, m, n, k, stream);
        if (who == 1) CublasGemm(handle, b.x, b.w, b.d_ref, m, n, k);
        if (who == 2) SwiGluReference(b.d_ref, b.h_ref, m, n, stream);
      }
      CHECK_CUDA(cudaEventRecord(stop, stream));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      if (round >= 0) ms_each[who] += ms / kReps / kRounds;
    }
  }
  const double flops = 2.0 * m * n * static_cast<double>(k);
  std::printf("time %-20s %5d x %5d x %5d: ours %.3f ms (%.0f TFLOP/s), cuBLAS %.3f ms (%.0f): ours/cuBLAS %.3f",
              name, m, n, k, ms_each[0], flops / ms_each[0] / 1e9, ms_each[1], flops / ms_each[1] / 1e9,
              ms_each[0] / ms_each[1]);
  if (swiglu) {
    std::printf("; SwiGLU pass %.3f ms: ours/(cuBLAS + pass) %.3f", ms_each[2],
                ms_each[0] / (ms_each[1] + ms_each[2]));
  }
  std::printf("\n");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  cublasDestroy(handle);
  Free(b);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "all";
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, sm_%d%d; stages %d, group %d, shared memory %d bytes a block\n", prop.name,
              prop.multiProcessorCount, prop.major, prop.minor, kStages, HG_GROUP, kSmemBytes);
  bool ok = true;
  if (what == "all" || what == "check") {
    // Tails in every dimension (M, N not tile multiples; K not a k-slice
    // multiple), several tiles a block, and the engine's K with its LoRA columns.
    ok = Check(Epilogue::kPlain, 256, 256, 64) && ok;
    ok = Check(Epilogue::kPlain, 1000, 1000, 1000) && ok;
    ok = Check(Epilogue::kPlain, 129, 264, 4096) && ok;
    ok = Check(Epilogue::kPlain, 2048, 6144, 4128) && ok;
    ok = Check(Epilogue::kSwiGlu, 256, 512, 128) && ok;
    ok = Check(Epilogue::kSwiGlu, 1000, 2 * 520, 1000) && ok;
    ok = Check(Epilogue::kSwiGlu, 2048, 2 * 3584, 4128) && ok;
  }
  if (what == "all" || what == "time") {
    // The 8b row's shapes (4 x 2048 tokens, LoRA r 16 widening K by 32).
    Time("q|k|v", Epilogue::kPlain, 8192, 6144, 4128);
    Time("gate|up", Epilogue::kPlain, 8192, 28672, 4128);
    Time("gate|up with SwiGLU", Epilogue::kSwiGlu, 8192, 28672, 4128);
    Time("down", Epilogue::kPlain, 8192, 4096, 14352);
    Time("square 8192", Epilogue::kPlain, 8192, 8192, 8192);
  }
  std::printf("%s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
  return ok ? 0 : 1;
}
