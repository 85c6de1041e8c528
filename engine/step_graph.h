// A training step's forward and backward passes as one CUDA graph.
//
// A step launches a few thousand kernels (about 2,600 for LoRA on an 8B
// model). Where they are short (small models, short batches) the host cannot
// launch them as fast as the GPU runs them and the GPU waits; a graph
// launches the whole recorded sequence at once. Measured on an H200
// (bench/speed/NOTES.md, "CUDA graphs of the step"): llama3-1b at 1 x 512
// tokens 3.8 times the steps a second, at 2 x 1024 1.7 times (packed rows:
// 1.5 times); at the bench's large rows, where the card runs at its power
// limit, within 1%.
//
// A replay repeats exactly what was recorded: the same kernels, on the same
// addresses, with the same arguments. Hence the contract:
//  - every step has the shapes of the captured one (PlanStepGraph gives the
//    batch shape that guarantees it for a job's data); its batch (token ids,
//    labels, positions and segments) is copied into the graph's own input
//    buffers first;
//  - the body divides by the step's target count read from a device scalar
//    the graph owns, not from a number baked into a kernel's arguments;
//  - the body draws no random numbers (no dropout) and never synchronises
//    with the host, and nothing it decides on the host depends on the
//    batch's values;
//  - the gradients are the tensors the capture made (the parameters' .grad
//    are unset at capture, so the first micro-batch's gradients become them,
//    and each replay writes them again); Run points the parameters' .grad at
//    them again after every replay;
//  - what is decided on the host stays outside: the LoRA copies' refresh
//    (LlamaModel::RefreshLoraCopies, before each replay), clipping, the
//    optimizer and the loss read-back.
//
// Capture needs a stream other than the device's default one: a StepGraph
// makes a stream of its own current for its lifetime (after the work queued
// so far) and, when destroyed, waits for it and restores the previous one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/status.h"
#include "engine/batch.h"
#include "engine/token_dataset.h"

namespace trainerd::engine {

// How the steps of a job over `data` run as one graph: the batch shape that
// makes every step's batches alike, or why they cannot (`obstacle`, "" when
// they can). Independent of the device.
//  - LoRA dropout (`dropout`: LlamaModel::HasDropout) draws random numbers: no graph.
//  - Unpacked examples must all have one length: padding every batch to the
//    longest example instead of its own longest row costs more than a graph saves.
//  - Packed rows are padded to the longest row, and their segments to
//    micro_batch_size times (the most examples in a row, plus a row's padding),
//    unless that padding would be more than a tenth of the tokens.
struct StepGraphPlan {
  std::string obstacle;
  BatchShape shape;
};
StepGraphPlan PlanStepGraph(const TokenDataset& data, bool dropout, int64_t micro_batch_size);

class StepGraph {
 public:
  // Runs one step's forward and backward over `batches` (the graph's input
  // buffers while capturing) and returns the loss sum, a 0-dim float32 tensor.
  // `targets`: the step's target-token count, a 0-dim float32 tensor on the device.
  using Body = std::function<torch::Tensor(const std::vector<Batch>& batches, const torch::Tensor& targets)>;

  // Whether this build can capture graphs on `device`: a LibTorch 2.x with
  // CUDA, and a CUDA device.
  static bool Supported(const torch::Device& device);

  // params: the tensors whose gradients the body makes. Only where Supported.
  StepGraph(std::vector<torch::Tensor> params, const torch::Device& device);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  bool captured() const;
  // Whether `batches` have the captured step's shapes (always false before capture).
  bool Matches(const std::vector<Batch>& batches) const;

  // Records `body` over copies of `batches` as the graph, then replays it once:
  // this step's loss sum. Releases the cache of free device memory first, so
  // that the graph's own memory pool does not hold it a second time. An error
  // (nothing recorded) names what failed; the job should then stop.
  StatusOr<torch::Tensor> CaptureAndRun(const std::vector<Batch>& batches, int64_t targets, const Body& body);

  // Copies `batches` (Matches) and `targets` into the graph's inputs and
  // replays it: the step's loss sum, the same tensor every time (read it, or
  // copy it, before the next Run).
  torch::Tensor Run(const std::vector<Batch>& batches, int64_t targets);

  // How many times the graph ran (the capture's own run included).
  int64_t runs() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace trainerd::engine
