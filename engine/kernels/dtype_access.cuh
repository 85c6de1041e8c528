// Device-side access to the three element types of fused_kernels.h: float32
// conversions, 16-byte vector loads/stores, the dtype dispatch and the
// launch-error check shared by rms_norm.cu, swiglu.cu and rope.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "engine/kernels/fused_kernels.h"

namespace trainerd::kernels::detail {

template <typename T>
__device__ __forceinline__ float ToFloat(T v);
template <>
__device__ __forceinline__ float ToFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ float ToFloat<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

// Round to nearest even, as a LibTorch cast does.
template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// The float32 value a tensor of dtype T holds after storing v.
template <typename T>
__device__ __forceinline__ float RoundTo(float v) { return ToFloat<T>(FromFloat<T>(v)); }

// Elements of T in one 16-byte vector.
template <typename T>
constexpr int kVecElems = 16 / static_cast<int>(sizeof(T));

// The bits of one element, in the low bits of a word, and back.
__device__ __forceinline__ uint32_t Bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ uint32_t Bits(__half v) { return __half_as_ushort(v); }
__device__ __forceinline__ uint32_t Bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
template <typename T>
__device__ __forceinline__ float FloatFromBits(uint32_t b);
template <>
__device__ __forceinline__ float FloatFromBits<float>(uint32_t b) { return __uint_as_float(b); }
template <>
__device__ __forceinline__ float FloatFromBits<__half>(uint32_t b) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
}
template <>
__device__ __forceinline__ float FloatFromBits<__nv_bfloat16>(uint32_t b) { return __uint_as_float(b << 16); }

// A 16-byte vector's elements as float32, unpacked with shifts and masks
// (element 0 is the low half of word x: little-endian).
template <typename T>
__device__ __forceinline__ void UnpackFloats(const uint4& raw, float (&f)[kVecElems<T>]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int q = 0; q < 4; ++q) f[q] = FloatFromBits<T>(w[q]);
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      f[2 * q] = FloatFromBits<T>(w[q] & 0xffffu);
      f[2 * q + 1] = FloatFromBits<T>(w[q] >> 16);
    }
  }
}

// One 16-byte load / store (p 16-byte aligned). Through the intrinsics, which
// are single 128-bit instructions by construction: a plain uint4 dereference
// was split into four 32-bit accesses in rope.cu. Loads take the read-only
// path: kernel inputs are never written by the same kernel.
__device__ __forceinline__ uint4 LoadVec(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ void StoreVec(void* p, uint4 v) { __stwb(reinterpret_cast<uint4*>(p), v); }

// kN consecutive elements at p, as float32. kN == kVecElems<T>: one 16-byte
// load (p must be 16-byte aligned); kN == 1: a scalar load.
template <typename T, int kN>
__device__ __forceinline__ void LoadFloats(const T* p, float (&f)[kN]) {
  if constexpr (kN == 1) {
    f[0] = ToFloat<T>(*p);
  } else {
    static_assert(kN == kVecElems<T>, "a vector is 16 bytes");
    UnpackFloats<T>(LoadVec(p), f);
  }
}

// A 16-byte vector of kVecElems<T> floats rounded to T (UnpackFloats' inverse).
template <typename T>
__device__ __forceinline__ uint4 PackFloats(const float (&f)[kVecElems<T>]) {
  uint32_t w[4];
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int q = 0; q < 4; ++q) w[q] = Bits(FromFloat<T>(f[q]));
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) w[q] = Bits(FromFloat<T>(f[2 * q])) | (Bits(FromFloat<T>(f[2 * q + 1])) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Rounds kN floats to T and stores them at p (16-byte aligned when kN > 1).
template <typename T, int kN>
__device__ __forceinline__ void StoreFloats(T* p, const float (&f)[kN]) {
  if constexpr (kN == 1) {
    *p = FromFloat<T>(f[0]);
  } else {
    static_assert(kN == kVecElems<T>, "a vector is 16 bytes");
    StoreVec(p, PackFloats<T>(f));
  }
}

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Calls f(T{}) with T the element type of `dtype`.
template <typename F>
std::string DispatchDType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(float{});
    case DType::kFloat16:
      return f(__half{});
    case DType::kBFloat16:
      return f(__nv_bfloat16{});
  }
  return "unknown dtype";
}

// "" when the last launch went in; else "<what>: <CUDA error name>: <text>".
inline std::string LaunchError(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return {};
  return std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
}

inline cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace trainerd::kernels::detail
