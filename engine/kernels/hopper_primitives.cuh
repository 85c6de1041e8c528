// Device and host pieces that the Hopper kernels (hopper_gemm.cu,
// hopper_attention.cu) share: mbarriers, TMA loads and stores, named
// barriers, register reallocation, wgmma's shared-memory descriptors and
// fences, the 64 x 64 chunk write of an accumulator, the rotary embedding's
// cos and sin, and the host's tensor maps. sm_90a only; included by .cu files
// of the sm_90a libraries.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>

namespace trainerd::kernels::hopper {

// cos and sin of position * inv_freq, rounded to bf16 as transformers' tables
// are (rope.cu's formula). Accurate sincosf: the angles reach the thousands.
__device__ __forceinline__ float2 RopeCosSin(float position, float inv_freq) {
  float c, s;
  sincosf(position * inv_freq, &s, &c);
  return make_float2(__bfloat162float(__float2bfloat16_rn(c)), __bfloat162float(__float2bfloat16_rn(s)));
}

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

// A 3-D map's box at (col, row, matrix) into shared memory, completing on bar.
__device__ __forceinline__ void TmaLoad3(void* dst, const CUtensorMap* map, int col, int row, int matrix,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::
          "r"(SmemAddress(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(matrix), "r"(SmemAddress(bar))
      : "memory");
}

// Asks L2 for a box of the map (no shared memory, no barrier).
[[maybe_unused]] __device__ __forceinline__ void TmaPrefetchL2(const CUtensorMap* map, int col, int row) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(col), "r"(row)
               : "memory");
}

// A TMA store of a box from shared memory, in the current bulk group.
__device__ __forceinline__ void TmaStoreUncommitted(const CUtensorMap* map, const void* src, int col, int row) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(col), "r"(row), "r"(SmemAddress(src))
               : "memory");
}

// A TMA store of a 3-D map's box at (col, row, matrix), in the current bulk group.
__device__ __forceinline__ void TmaStore3Uncommitted(const CUtensorMap* map, const void* src, int col, int row,
                                                     int matrix) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(col), "r"(row), "r"(matrix), "r"(SmemAddress(src))
               : "memory");
}

__device__ __forceinline__ void TmaStoreCommit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

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

// Shared-memory matrix descriptors for operands in 128-byte swizzle atoms
// (8 rows of 128 bytes: 64 bf16), as TMA's 128-byte swizzle lays them out:
// start address >> 4, leading and stride byte offsets >> 4, swizzle mode 1.
// K-major (X, and W as stored: a row of k per row): the stride byte offset
// is 1024 between 8-row groups (the leading one is unused); a k16 step is 32
// bytes along the row.
__device__ __forceinline__ uint64_t DescriptorK(uint32_t smem_address) {
  return static_cast<uint64_t>((smem_address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (uint64_t{1} << 62);
}

// MN-major (W transposed: a row of n per k): blocks of 64 k-rows by 64
// columns, one TMA box each, 8 KB apart along n (the leading byte offset);
// 8-row groups of k 1024 apart (the stride byte offset); a k16 step is 2048
// bytes (16 rows).
__device__ __forceinline__ uint64_t DescriptorMN(uint32_t smem_address) {
  return static_cast<uint64_t>((smem_address & 0x3FFFF) >> 4) | (static_cast<uint64_t>(8192 >> 4) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads of these accumulators above the
// preceding WgmmaWait (the asm that wrote them does not say they are async).
template <int N>
__device__ __forceinline__ void FenceRegisters(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Writes 8 accumulator column groups (64 columns: groups first .. first + 7)
// of this warp's 16 rows into a 64 x 64 chunk buffer in TMA's 128-byte
// swizzle (16-byte unit u of row r at unit u ^ (r % 8)). value(i, e) gives
// the float of group i, element e (0, 1: row lane / 4, columns 2 (lane % 4)
// and + 1; 2, 3: the same columns 8 rows down), wgmma's accumulator layout.
template <typename Value>
__device__ __forceinline__ void WriteChunk(uint8_t* chunk, int warp, int lane, int first, Value value) {
  // stmatrix: four 8 x 8 matrices an instruction (groups j and j + 1, upper
  // and lower rows): lane l gives row l % 8 of matrix l / 8, and holds in
  // register q the pair its accumulator has in matrix q.
  const int q = lane / 8;
  const int row = 16 * warp + (q & 1) * 8 + lane % 8;
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
    const uint32_t r0 = PackBf16(value(first + j, 0), value(first + j, 1));
    const uint32_t r1 = PackBf16(value(first + j, 2), value(first + j, 3));
    const uint32_t r2 = PackBf16(value(first + j + 1, 0), value(first + j + 1, 1));
    const uint32_t r3 = PackBf16(value(first + j + 1, 2), value(first + j + 1, 3));
    const int unit = j + (q >> 1);
    const uint32_t address = SmemAddress(chunk + row * 128 + ((unit ^ (row % 8)) * 16));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(address), "r"(r0),
                 "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
  }
}

// ---- host ----

// The current device: whether it is a Hopper GPU (compute capability 9.0)
// and its SM count, read once a device.
struct DeviceInfo {
  bool hopper = false;
  int sms = 0;
};

inline DeviceInfo CurrentDevice() {
  constexpr int kMaxDevices = 64;
  static std::once_flag once[kMaxDevices];
  static DeviceInfo info[kMaxDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return {};
  std::call_once(once[device], [device] {
    int major = 0, minor = 0, sms = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    info[device] = {major == 9 && minor == 0, sms};
  });
  return info[device];
}

// Whether p is 16-byte aligned (TMA's and the 16-byte vectors' rule).
inline bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Raises the kernel's dynamic shared-memory limit to `bytes`, once a device:
// "" or why not.
template <auto kKernel>
std::string AllowSharedMemory(int bytes) {
  static std::once_flag once[64];
  static cudaError_t raised[64];
  int device = 0;
  cudaGetDevice(&device);
  std::call_once(once[device % 64], [&] {
    raised[device % 64] = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  });
  return raised[device % 64] == cudaSuccess
             ? ""
             : std::string("raising the shared-memory limit failed: ") + cudaGetErrorString(raised[device % 64]);
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's tensor-map encoder, through the runtime (no link to libcuda).
inline EncodeTiled Encoder() {
  static EncodeTiled encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<EncodeTiled>(fn);
  }();
  return encode;
}

// A bf16 map over rows x cols (rows ld elements apart), box box_rows x 64
// columns, 128-byte swizzle; with batches > 0 a 3-D map over `batches` such
// matrices batch_stride elements apart (box: one matrix), for TMA's 3-D
// loads and stores (a 2-D map there is an illegal instruction). A box
// reaching past a matrix's rows reads zeros there and stores nothing there.
// "" or why not. Makes the current device's context current first: the
// encoder is the driver's, and a thread that has made no runtime call yet
// (autograd's backward thread) has none.
inline std::string Map(CUtensorMap* map, const void* base, int64_t rows, int64_t cols, int64_t ld, int box_rows,
                       int64_t batches = 0, int64_t batch_stride = 0) {
  const EncodeTiled encode = Encoder();
  if (encode == nullptr) return "the driver has no cuTensorMapEncodeTiled";
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    return "no current CUDA device";
  }
  const cuuint32_t rank = batches > 0 ? 3 : 2;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(batches)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld * 2), static_cast<cuuint64_t>(batch_stride * 2)};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void*>(base), dims, strides, box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return "cuTensorMapEncodeTiled failed (" + std::to_string(static_cast<int>(r)) + ") for " +
           (batches > 0 ? std::to_string(batches) + " x " : std::string()) + std::to_string(rows) + " x " +
           std::to_string(cols) + ", row stride " + std::to_string(ld);
  }
  return "";
}

}  // namespace trainerd::kernels::hopper
