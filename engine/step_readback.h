// Reads a step's scalars (loss, gradient norm) back to the host without
// stalling the GPU's queue: Start copies them into pinned memory on the
// current CUDA stream right after the step was queued and records an event;
// Wait blocks only until that event, so work queued later (the next step's
// forward and backward) keeps the GPU busy meanwhile. A plain .item() would
// wait for everything queued before it. On the CPU both are immediate.
//
// The event also times the step on the device: SecondsBetween gives the GPU
// time between the ends of two steps, which the host's clock cannot (it reads
// a step's end only when the next step is queued, a variable time later).
#pragma once

#include <memory>
#include <optional>
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
  // The values, in Start's order, as double. The readback stays started (its
  // event can still be timed against).
  std::vector<double> Wait();

  // Seconds on the device from `earlier`'s Start to `later`'s, both waited
  // for; nullopt on the CPU or when either was not started.
  static std::optional<double> SecondsBetween(const StepReadback& earlier, const StepReadback& later);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace trainerd::engine
