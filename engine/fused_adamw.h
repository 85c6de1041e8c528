// AdamW's update as one multi-tensor CUDA kernel per parameter group
// (at::_fused_adamw_, what PyTorch's AdamW(fused=True) runs) instead of about
// ten small kernels per parameter: for LoRA on all seven projections of a
// 32-layer model that is 448 tensors, thousands of launches a step.
//
// The state stays in the torch::optim::AdamW it is built on (exp_avg,
// exp_avg_sq, step per parameter), so checkpoints save and restore it as
// before and the plain step can take over at any time. The arithmetic is
// AdamW's: decoupled weight decay, bias corrections, eps outside the sqrt.
#pragma once

#include <map>

#include <torch/torch.h>

namespace trainerd::engine {

class FusedAdamW {
 public:
  explicit FusedAdamW(torch::optim::AdamW& optimizer) : optimizer_(optimizer) {}

  // Whether the fused kernel runs for parameters on `device` (CUDA with
  // LibTorch 2.x); otherwise Step() is the optimizer's own step.
  static bool Available(const torch::Device& device);

  // One update of every parameter with a gradient, at each group's options.
  void Step(const torch::Device& device);

  // Creates the state of parameters that have none yet (zeros, step 0), as the
  // first step would: lets a memory probe see the optimizer's full footprint.
  void InitializeState();

 private:
  torch::optim::AdamW& optimizer_;
  // Per parameter: its step count as the fused kernel wants it (a float32
  // scalar on the device) and the host count it was last synchronised with.
  struct StepCounter {
    torch::Tensor device_step;
    int64_t host_step = -1;
  };
  std::map<const void*, StepCounter> steps_;
};

}  // namespace trainerd::engine
