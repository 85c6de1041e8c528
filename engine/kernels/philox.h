// Philox4x32-10, the counter-based generator of Salmon et al. ("Parallel
// random numbers: as easy as 1, 2, 3", SC 2011) that cuRAND and LibTorch use,
// and LoRA dropout's keep rule on it: the same bits on the host and in a
// kernel, so that a mask is a function of (seed, mask number, element), made again
// wherever it is needed instead of stored.
//
// Torch-free and CUDA-free: plain C++ that nvcc compiles for the device too.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TRAINERD_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TRAINERD_HOST_DEVICE inline
#endif

namespace trainerd::kernels {

struct Philox4 {
  uint32_t v[4];
};

// Ten rounds of Philox4x32 on `counter` under the 64-bit `key`: four
// independent uniform 32-bit words. Counter words: (c0, c1, c2, c3) as
// LibTorch's philox_engine(seed = key, subsequence = c2 | c3 << 32,
// offset = c0 | c1 << 32) lays them out (its first four outputs).
TRAINERD_HOST_DEVICE Philox4 Philox4x32_10(Philox4 c, uint64_t key) {
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
#if defined(__CUDA_ARCH__)
    // 32-bit halves by name: left to the 64-bit product, nvcc keeps the state
    // in 64-bit registers (64-bit XORs, masks and shifts each round).
    const uint32_t hi0 = __umulhi(0xD2511F53u, c.v[0]), lo0 = 0xD2511F53u * c.v[0];
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c.v[2]), lo1 = 0xCD9E8D57u * c.v[2];
#else
    const uint64_t p0 = uint64_t{0xD2511F53u} * c.v[0];
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c.v[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
#endif
    c = Philox4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
  }
  return c;
}

// The four words whose 16-bit halves decide elements 8q .. 8q + 7 of dropout
// mask number `mask` under `seed`: counter (q, mask).
TRAINERD_HOST_DEVICE Philox4 DropoutWords(uint64_t seed, uint64_t mask, uint64_t q) {
  return Philox4x32_10(Philox4{{static_cast<uint32_t>(q), static_cast<uint32_t>(q >> 32),
                                static_cast<uint32_t>(mask), static_cast<uint32_t>(mask >> 32)}},
                       seed);
}

// Element e (row-major index in the masked matrix) draws the 16-bit half
// (low for even e) of word (e % 8) / 2 of DropoutWords(seed, mask, e / 8):
// j = e % 8 here. Two elements a word halves the Philox work, which bounds
// the kernel's speed; p then moves in steps of 2^-16.
TRAINERD_HOST_DEVICE uint32_t DropoutDraw16(const Philox4& words, int j) {
  return (words.v[j >> 1] >> ((j & 1) * 16)) & 0xFFFFu;
}

// An element is kept when its draw is at least `drop_below`: dropped with
// probability drop_below / 2^16.
TRAINERD_HOST_DEVICE bool DropoutKeeps(uint32_t draw16, uint32_t drop_below) { return draw16 >= drop_below; }

// drop_below for dropout probability p in [0, 1): round(p * 2^16), capped
// below 2^16 (p never drops everything).
inline uint32_t DropoutThreshold(double p) {
  const double scaled = p * 65536.0 + 0.5;
  if (!(scaled > 0)) return 0;
  if (scaled >= 65535.0) return 0xFFFFu;
  return static_cast<uint32_t>(scaled);
}

}  // namespace trainerd::kernels
