// The language-model head and its cross-entropy in one step, chunked over
// tokens, so that the logits over the whole vocabulary never exist for the
// whole batch (at most kLinearCrossEntropyChunkElements of them at once), and
// float32 logits never at all.
//
// Why: for 8 x 2048 tokens and Llama 3's 128,256-word vocabulary the logits
// are 4.2 GB in bf16 and 8.4 GB in float32, and autograd would keep both (and
// their gradient) alive until the backward pass.
//
// How: the forward pass computes each chunk's logits (model dtype); one fused
// pass (FusedSoftmaxCrossEntropyRows, engine/fused_ops.h) takes each row's
// log-sum-exp in float32 and, when a gradient is wanted, overwrites the
// logits with softmax - onehot(label); then the chunk's gradient with respect
// to the hidden states is computed right away, (softmax - onehot) @ W, keeping only that (tokens, H) result for the
// backward pass, which scales it by the incoming gradient (the loss is linear
// in it). When the head's weight itself is trainable (full fine-tuning), its
// gradient is accumulated the same way in float32.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace trainerd::engine {

// At most this many logits (tokens x vocabulary) per chunk: 512 MiB in bf16.
inline constexpr int64_t kLinearCrossEntropyChunkElements = int64_t{1} << 28;

// hidden: (N, H) in the model dtype; weight: (V, H) in the model dtype;
// targets: (N) int64, `ignore_index` where a position has no label.
// Returns the 0-dim float32 sum over labelled positions of
// -log softmax(hidden @ weight^T)[target], computed as transformers does
// (logits in the model dtype, softmax in float32). Differentiable with
// respect to hidden and weight.
torch::Tensor LinearCrossEntropySum(const torch::Tensor& hidden, const torch::Tensor& weight,
                                    const torch::Tensor& targets, int64_t ignore_index,
                                    int64_t chunk_elements = kLinearCrossEntropyChunkElements);

}  // namespace trainerd::engine
