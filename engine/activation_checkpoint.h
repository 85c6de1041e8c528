// Activation checkpointing of one decoder layer: the forward pass runs the
// layer without recording autograd state and keeps only its input; the
// backward pass runs the layer again with gradients on and back-propagates
// through that copy (a reentrant backward). Adapter gradients accumulate into
// their .grad as usual; the layer input's gradient is returned.
//
// Memory: one (B, T, H) tensor per layer (its input, the residual stream
// summed) instead of every intermediate. Cost:
// each layer's forward runs twice. LoRA dropout makes the same masks in the
// second run: it is given the first run's draw (LayerInputs::dropout), and
// the generator is not touched.
#pragma once

#include <cstddef>

#include <torch/torch.h>

#include "engine/llama_model.h"

namespace trainerd::engine {

// model.LayerForward(index, h, in), checkpointed. `model` and `in` must stay
// unchanged until the backward pass has run.
LlamaModel::Residual CheckpointedLayer(const LlamaModel& model, size_t index, const LlamaModel::Residual& h,
                                       const LlamaModel::LayerInputs& in);

}  // namespace trainerd::engine
