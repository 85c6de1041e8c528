// Micro-batches of token examples and the causal-LM loss over them.
#pragma once

#include <vector>

#include <torch/torch.h>

#include "engine/llama_model.h"
#include "engine/token_dataset.h"

namespace trainerd::engine {

struct Batch {
  torch::Tensor input_ids;  // (B, T) int64, right-padded with token 0
  torch::Tensor labels;     // (B, T) int64, -100 at padding
  torch::Tensor position_ids;  // (B, T) int64 for packed examples, else undefined
  // position_ids' segments, computed where the batch is built (no device sync
  // in the forward); only for packed batches on CUDA, where the variable-length
  // attention path may use them (LlamaModel::Hidden).
  PackedSegments segments;
  int64_t input_tokens = 0;   // non-padding tokens
  int64_t target_tokens = 0;  // positions 1..T-1 with a label
  // Sum over the batch's sequences (packed examples count one by one) of their
  // length squared: the attention term of the step's FLOPs (engine/flops.h).
  double sum_squared_lengths = 0;
};

// A fixed shape for batches, so that every step's batches look alike (a CUDA
// graph's replay, engine/step_graph.h): rows padded to at least `width`
// tokens, and packed batches' segments padded to `segments`
// (PackedSegmentsFromPositions' capacity). Zeros: as the examples need.
struct BatchShape {
  int64_t width = 0;
  int64_t segments = 0;
};

// Pads the examples to the longest one (or shape.width). Padding sits after
// each row's real tokens, so causal attention keeps it from influencing them.
// On CUDA the tensors travel through pinned memory with asynchronous copies:
// building a batch never waits for the GPU to finish the work already queued.
Batch MakeBatch(const std::vector<const TokenExample*>& examples, const torch::Device& device,
                const BatchShape& shape = {});

// Sum over target positions of -log softmax(logits)[label], computed in
// float32, as a 0-dim float32 tensor (differentiable). The logits at
// position t score labels[t + 1].
torch::Tensor CausalLmLossSum(const LlamaModel& model, const Batch& batch);

}  // namespace trainerd::engine
