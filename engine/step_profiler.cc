#include "engine/step_profiler.h"

#include <cstdio>
#include <exception>
#include <set>

#include <torch/torch.h>
#include <torch/version.h>

// The API is declared in every LibTorch 2 (a build without Kineto throws when enabled).
#if TORCH_VERSION_MAJOR >= 2
#define TRAINERD_HAVE_KINETO 1
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

namespace trainerd::engine {
namespace {

#ifdef TRAINERD_HAVE_KINETO
namespace prof = torch::profiler::impl;

prof::ProfilerConfig TraceConfig() {
  return prof::ProfilerConfig(prof::ProfilerState::KINETO, /*report_input_shapes=*/true, /*profile_memory=*/false);
}

std::set<prof::ActivityType> TraceActivities() {
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (torch::cuda::is_available()) activities.insert(prof::ActivityType::CUDA);
  return activities;
}
#endif

}  // namespace

Status StepProfiler::Check(const ProfileRequest& request) {
  if (request.path.empty()) return Status::Ok();
  if (request.first < 1 || request.last < request.first) {
    return Status::Error("profile steps " + std::to_string(request.first) + "-" + std::to_string(request.last) +
                         ": want FIRST-LAST with 1 <= FIRST <= LAST");
  }
#ifdef TRAINERD_HAVE_KINETO
  return Status::Ok();
#else
  return Status::Error("cannot write a profile (" + request.path + "): this build's LibTorch (" TORCH_VERSION
                       ") cannot; build against LibTorch 2 (PyTorch's)");
#endif
}

StepProfiler::~StepProfiler() {
#ifdef TRAINERD_HAVE_KINETO
  if (active_) {
    try {
      torch::autograd::profiler::disableProfiler();
    } catch (const std::exception&) {  // the run is ending anyway
    }
  }
#endif
}

Status StepProfiler::BeforeStep(int64_t run_step) {
  if (request_.path.empty() || run_step != request_.first) return Status::Ok();
#ifdef TRAINERD_HAVE_KINETO
  try {
    torch::autograd::profiler::prepareProfiler(TraceConfig(), TraceActivities());
    torch::autograd::profiler::enableProfiler(TraceConfig(), TraceActivities());
  } catch (const std::exception& e) {
    return Status::Error("starting the profiler for " + request_.path + ": " + e.what());
  }
  active_ = true;
#endif
  return Status::Ok();
}

Status StepProfiler::AfterStep(int64_t run_step) {
  if (!active_ || run_step != request_.last) return Status::Ok();
#ifdef TRAINERD_HAVE_KINETO
  if (torch::cuda::is_available()) torch::cuda::synchronize();
  active_ = false;
  const std::string tmp = request_.path + ".tmp";
  try {
    torch::autograd::profiler::disableProfiler()->save(tmp);
  } catch (const std::exception& e) {
    std::remove(tmp.c_str());
    return Status::Error("writing the profile " + request_.path + ": " + e.what());
  }
  if (std::rename(tmp.c_str(), request_.path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Status::Error("writing the profile " + request_.path + ": cannot rename " + tmp + " over it");
  }
#endif
  return Status::Ok();
}

}  // namespace trainerd::engine
