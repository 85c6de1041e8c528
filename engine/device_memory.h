// What the engine asks of a device beyond LibTorch's portable API: the CUDA
// caching allocator's peak, the card's total memory and name. Every function
// answers for the CPU too (0, or "cpu"), and for builds whose LibTorch has no
// CUDA (TRAINERD_WITH_C10_CUDA unset: Debian's CPU LibTorch).
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

namespace trainerd::engine {

// The most memory the CUDA caching allocator has had allocated on `device`
// since the process started or the last ResetPeakMemory; 0 on the CPU.
int64_t PeakMemoryBytes(const torch::Device& device);
void ResetPeakMemory(const torch::Device& device);

// The card's memory in bytes; 0 on the CPU or when unknown.
int64_t TotalMemoryBytes(const torch::Device& device);

// Returns cached, unused blocks to the driver (after an out-of-memory probe).
void ReleaseCachedMemory(const torch::Device& device);

// "NVIDIA H200", or "cpu".
std::string DeviceModelName(const torch::Device& device);

// Whether `e` is LibTorch's out-of-memory error.
bool IsOutOfMemory(const c10::Error& e);

}  // namespace trainerd::engine
