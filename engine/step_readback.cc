#include "engine/step_readback.h"

#ifdef TRAINERD_WITH_C10_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace trainerd::engine {

struct StepReadback::State {
  torch::Tensor values;  // (n) float64: pinned host memory on CUDA, else the values themselves
  bool on_cuda = false;
#ifdef TRAINERD_WITH_C10_CUDA
  at::cuda::CUDAEvent done{cudaEventDefault};  // with timing (the default event has none)
#endif
};

StepReadback::StepReadback() = default;
StepReadback::~StepReadback() = default;
StepReadback::StepReadback(StepReadback&&) noexcept = default;
StepReadback& StepReadback::operator=(StepReadback&&) noexcept = default;

void StepReadback::Start(const std::vector<torch::Tensor>& scalars) {
  state_ = std::make_unique<State>();
  torch::Tensor packed = torch::stack(scalars).to(torch::kFloat64);
#ifdef TRAINERD_WITH_C10_CUDA
  if (packed.is_cuda()) {
    state_->on_cuda = true;
    state_->values = torch::empty(packed.sizes(), torch::TensorOptions().dtype(torch::kFloat64).pinned_memory(true));
    state_->values.copy_(packed, /*non_blocking=*/true);
    state_->done.record(c10::cuda::getCurrentCUDAStream(packed.device().index()));
    return;
  }
#endif
  state_->values = packed.to(torch::kCPU);
}

bool StepReadback::started() const { return state_ != nullptr; }

std::vector<double> StepReadback::Wait() {
  TORCH_CHECK(state_, "StepReadback::Wait without Start");
#ifdef TRAINERD_WITH_C10_CUDA
  if (state_->on_cuda) state_->done.synchronize();
#endif
  const torch::Tensor v = state_->values.contiguous();
  return std::vector<double>(v.data_ptr<double>(), v.data_ptr<double>() + v.numel());
}

std::optional<double> StepReadback::SecondsBetween(const StepReadback& earlier, const StepReadback& later) {
#ifdef TRAINERD_WITH_C10_CUDA
  if (earlier.state_ && later.state_ && earlier.state_->on_cuda && later.state_->on_cuda) {
    try {
      return earlier.state_->done.elapsed_time(later.state_->done) / 1000.0;
    } catch (const c10::Error&) {  // an event that cannot be timed: the caller uses the host clock
      return std::nullopt;
    }
  }
#else
  (void)earlier;
  (void)later;
#endif
  return std::nullopt;
}

}  // namespace trainerd::engine
