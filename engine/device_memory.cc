#include "engine/device_memory.h"

#ifdef TRAINERD_WITH_C10_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace trainerd::engine {

int64_t PeakMemoryBytes(const torch::Device& device) {
#ifdef TRAINERD_WITH_C10_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[0].peak;  // [0]: StatType::AGGREGATE, every pool
  }
#endif
  (void)device;
  return 0;
}

void ResetPeakMemory(const torch::Device& device) {
#ifdef TRAINERD_WITH_C10_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
  (void)device;
}

int64_t TotalMemoryBytes(const torch::Device& device) {
#ifdef TRAINERD_WITH_C10_CUDA
  if (device.is_cuda()) return static_cast<int64_t>(at::cuda::getDeviceProperties(device.index())->totalGlobalMem);
#endif
  (void)device;
  return 0;
}

void ReleaseCachedMemory(const torch::Device& device) {
#ifdef TRAINERD_WITH_C10_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  (void)device;
}

std::string DeviceModelName(const torch::Device& device) {
#ifdef TRAINERD_WITH_C10_CUDA
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index())->name;
#endif
  return device.str();
}

bool IsOutOfMemory(const c10::Error& e) {
  const std::string what = e.what_without_backtrace();
  return what.find("out of memory") != std::string::npos;
}

}  // namespace trainerd::engine
