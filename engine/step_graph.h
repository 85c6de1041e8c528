// A training step's forward and backward passes as CUDA graphs: one graph
// per micro-batch shape, replayed for every micro-batch of that shape.
//
// A step launches a few thousand kernels (about 2,600 for LoRA on an 8B
// model). Where they are short (small models, short batches) the host cannot
// launch them as fast as the GPU runs them and the GPU waits; a graph
// launches the whole recorded sequence at once. Measured on an H200
// (bench/speed/NOTES.md, "CUDA graphs of the step"): llama3-1b on examples of
// 64 to 1,024 tokens, 4 a micro-batch, 2.4 times the tokens a second; at
// 1 x 512 tokens about 3.5 times; at the bench's large rows, where the card
// runs at its power limit, within 1%.
//
// A replay repeats exactly what was recorded: the same kernels, on the same
// addresses, with the same arguments. Hence the contract:
//  - a micro-batch replays the graph recorded for its shape (batch size,
//    width, segment count); its tensors (token ids, labels, positions and
//    segments) are copied into that graph's own input buffers first. Widths
//    are rounded up (StepGraphPlan::ShapeOf), so that a job over examples of
//    many lengths needs few graphs;
//  - the body divides by the step's target count read from a device scalar,
//    not from a number baked into a kernel's arguments;
//  - the body never synchronises with the host, and nothing it decides on
//    the host depends on the batch's values; its random numbers (LoRA
//    dropout's masks) come from the generator's graph-safe state, which each
//    replay advances (engine/lora_dropout.h): every replay draws new masks,
//    the ones the same micro-batch would draw kernel by kernel;
//  - the gradients are the parameters' .grad, made once and zeroed in place
//    at every step (BeginStep): each micro-batch, recorded or not, adds into
//    them, so that every graph writes the same tensors (the widened LoRA
//    groups add theirs in their batch of casts, engine/linear_group.cc,
//    rather than leave autograd an add per parameter);
//  - what is decided on the host stays outside: the LoRA copies' refresh
//    (LlamaModel::RefreshLoraCopies, before the step), clipping, the
//    optimizer and the loss read-back.
//
// Memory: every graph records into one memory pool, whose blocks are each
// graph's intermediates: micro-batches run one after another, so no two of
// them are alive at once, and the pool is as large as the largest graph's
// needs, not their sum. What outlives a micro-batch lives outside the pool
// (the gradients, the input buffers, the target count); a micro-batch's loss
// sum is the one thing a graph leaves there, and the caller adds it to the
// step's loss before the next micro-batch runs. A shape's first micro-batch
// runs kernel by kernel (that makes cuDNN's plans and the like for its shape
// before a capture must find them made), allocating from the same pool once
// it exists; its second is recorded.
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

// Rows of the batches that graphs run are padded to a multiple of this many
// tokens for every 2,048 of the longest example (16 up to 2,048 tokens, 32 up
// to 4,096, ...), at most to the longest: at most 128 widths, so at most 128
// graphs a job, and a row gains under 1/128 of the longest example in padding.
constexpr int64_t kGraphWidthMultiple = 16;

// How a job's micro-batches run as graphs, or why they cannot (`obstacle`,
// "" when they can). Independent of the device.
//  - Packed and unpacked examples cannot be mixed (a batch's inputs differ).
struct StepGraphPlan {
  std::string obstacle;
  int64_t longest = 0;         // tokens of the longest example (row): no batch is wider
  int64_t width_multiple = 0;  // kGraphWidthMultiple for every 2,048 tokens of `longest`
  int64_t segments = 0;        // packed: every batch's attention segments (its capacity); 0: unpacked

  // The shape a micro-batch of `examples` takes: its longest row rounded up
  // to a multiple of `width_multiple`, at most `longest`; packed, `segments`.
  BatchShape ShapeOf(const std::vector<const TokenExample*>& examples) const;
};
StepGraphPlan PlanStepGraph(const TokenDataset& data, int64_t micro_batch_size);

class StepGraph {
 public:
  // One micro-batch's forward and backward (the graph's input buffers while
  // capturing): adds its gradients into the parameters' .grad and returns its
  // loss sum, a 0-dim float32 tensor. `targets`: the step's target-token
  // count, a 0-dim float32 tensor on the device.
  using Body = std::function<torch::Tensor(const Batch& batch, const torch::Tensor& targets)>;

  // Whether this build can capture graphs on `device`: a LibTorch 2.3 or later with
  // CUDA, and a CUDA device.
  static bool Supported(const torch::Device& device);

  // params: the tensors whose gradients `body` makes. Only where Supported.
  StepGraph(std::vector<torch::Tensor> params, const torch::Device& device, Body body);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Starts a step: the gradients zeroed in place (made the first time), the
  // target count set.
  void BeginStep(int64_t targets);

  // Runs one micro-batch of the step: its shape's graph, recorded now if the
  // shape ran once before (and the run has taken the steps a capture needs
  // behind it), else kernel by kernel. Returns its loss sum, valid until the
  // next Run: add it to the step's. An error (nothing recorded) names what
  // failed; the job should then stop.
  StatusOr<torch::Tensor> Run(const Batch& batch);

  // Micro-batches run so far, and how many of them a graph ran (the captures' own runs included).
  int64_t micro_batches() const;
  int64_t graph_runs() const;
  // Graphs recorded: one per micro-batch shape.
  int64_t graphs() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace trainerd::engine
