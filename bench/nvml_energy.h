// Joules a launch at the card's power cap, for the CUDA benchmark programs
// (bench/gemm, bench/attention). A training step runs its kernels back to
// back at the power limit, where a kernel's time is its energy over the
// limit: a kernel faster alone but not cheaper in joules gains nothing there.
#pragma once

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <chrono>

#include "bench/cuda_check.h"

// The driver's NVML, opened at run time (no header or library at build time):
// the card's energy counter (millijoules since the driver loaded), its power
// and its SM clock, for the current CUDA device.
class Nvml {
 public:
  Nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (lib == nullptr) return;
    auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    auto handle = reinterpret_cast<int (*)(unsigned, void**)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    energy_ = reinterpret_cast<int (*)(void*, unsigned long long*)>(dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
    power_ = reinterpret_cast<int (*)(void*, unsigned*)>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    clock_ = reinterpret_cast<int (*)(void*, int, unsigned*)>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    int device = 0;
    CHECK_CUDA(cudaGetDevice(&device));
    ok_ = init != nullptr && handle != nullptr && energy_ != nullptr && power_ != nullptr && clock_ != nullptr &&
          init() == 0 && handle(static_cast<unsigned>(device), &device_) == 0;
  }
  bool ok() const { return ok_; }
  double Joules() const {
    unsigned long long mj = 0;
    energy_(device_, &mj);
    return mj / 1000.0;
  }
  double Watts() const {
    unsigned mw = 0;
    power_(device_, &mw);
    return mw / 1000.0;
  }
  unsigned SmMhz() const {
    unsigned mhz = 0;
    clock_(device_, /*NVML_CLOCK_SM*/ 1, &mhz);
    return mhz;
  }

 private:
  bool ok_ = false;
  void* device_ = nullptr;
  int (*energy_)(void*, unsigned long long*) = nullptr;
  int (*power_)(void*, unsigned*) = nullptr;
  int (*clock_)(void*, int, unsigned*) = nullptr;
};

// One contestant's reading: milliseconds and joules a launch, the mean power
// and SM clock sampled meanwhile, and how many launches that was.
struct EnergyReading {
  double ms = 0, joules = 0, watts = 0, mhz = 0;
  long launches = 0;
};

// `launch()` (one launch on `stream`) 50 times to reach the cap's clock, then
// back to back for `seconds`, the stream synchronised every 20 launches to
// sample power and clock.
template <typename Launch>
EnergyReading BackToBack(const Nvml& nvml, cudaStream_t stream, double seconds, Launch launch) {
  for (int i = 0; i < 50; ++i) launch();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  EnergyReading r;
  const double j0 = nvml.Joules();
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  int samples = 0;
  while (elapsed < seconds) {
    for (int i = 0; i < 20; ++i, ++r.launches) launch();
    CHECK_CUDA(cudaStreamSynchronize(stream));
    r.watts += nvml.Watts();
    r.mhz += nvml.SmMhz();
    ++samples;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  r.joules = (nvml.Joules() - j0) / r.launches;
  r.ms = 1e3 * elapsed / r.launches;
  r.watts /= samples;
  r.mhz /= samples;
  return r;
}
