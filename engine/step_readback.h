// Reads a step's scalars (loss, gradient norm) back to the host without
// stalling the GPU's queue: Start copies them into pinned memory on the
// current CUDA stream right after the step was queued and records an event;
// Wait blocks only until that event, so work queued later (the next step's
// forward and backward) keeps the GPU busy meanwhile. A plain .item() would
// wait for everything queued before it. On the CPU both are immediate.
#pragma once

#include <memory>
#include <vector>

#include <torch/torch.h>

namespace trainerd::engine {

class StepReadback {
 public:
  StepReadback();
  ~StepReadback();
  StepReadback(StepReadback&&) noexcept;
  StepReadback& operator=(StepReadback&&) noexcept;

  // scalars: 0-dim tensors, all on one device.
  void Start(const std::vector<torch::Tensor>& scalars);
  bool started() const;
  // The values, in Start's order, as double.
  std::vector<double> Wait();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace trainerd::engine
