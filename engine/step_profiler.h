// A Chrome trace (chrome://tracing, ui.perfetto.dev) of chosen training steps:
// every operator on the host and every CUDA kernel and copy on the GPU, from
// LibTorch's Kineto profiler. For finding where a step's time goes;
// bench/speed/trace_summary.py totals the GPU time by kernel.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace trainerd::engine {

// What to trace: steps first..last of the run (1 = the run's first step,
// resumed or not), written to `path` after step `last`.
struct ProfileRequest {
  std::string path;  // empty: no tracing
  int64_t first = 3;
  int64_t last = 4;
};

class StepProfiler {
 public:
  // Error when `request` asks for a trace and this build cannot make one
  // (LibTorch before 2.0).
  static Status Check(const ProfileRequest& request);

  explicit StepProfiler(ProfileRequest request) : request_(std::move(request)) {}
  ~StepProfiler();

  // Around each step; run_step counts from 1. After the last traced step the
  // GPU is synchronised and the trace written (atomically: a temporary file
  // renamed over `path`).
  Status BeforeStep(int64_t run_step);
  Status AfterStep(int64_t run_step);

 private:
  ProfileRequest request_;
  bool active_ = false;
};

}  // namespace trainerd::engine
