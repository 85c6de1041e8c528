// `training.micro_batch_size: auto`: the largest micro-batch that fits the
// GPU, found before the first step without risking the job.
//
// How: with the optimizer's state reserved (two float tensors per trainable
// tensor, as AdamW will hold), forward and backward passes of 1, 2, 4, ...
// copies of the training set's longest example run under the model's own
// settings (dtype, gradient checkpointing). A size fits when its pass ends
// without an out-of-memory error and its peak stays under 90% of the card's
// memory (headroom for fragmentation and the optimizer's update); the search
// stops at the first size that does not fit, at kMaxAutoMicroBatch, or at the
// training set's size. The random generators are restored afterwards, so the
// run that follows draws exactly what it would have with the size written out.
//
// On the CPU there is no memory limit to find: the choice is 1.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "engine/checkpoint.h"
#include "engine/llama_model.h"
#include "engine/token_dataset.h"

namespace trainerd::engine {

inline constexpr int64_t kMaxAutoMicroBatch = 64;

struct MicroBatchChoice {
  int64_t micro_batch_size = 1;
  std::string explanation;  // for the job's log: what was tried and why it stopped
};

StatusOr<MicroBatchChoice> FindMicroBatchSize(LlamaModel& model, const TokenDataset& train,
                                              const NamedTensors& trainable);

}  // namespace trainerd::engine
