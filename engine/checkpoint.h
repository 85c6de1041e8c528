// Training checkpoints: everything needed to continue a run exactly.
//
// A checkpoint is a folder output.dir/checkpoints/checkpoint-<step>/ holding
//   state.json          {"format": "trainerd-checkpoint", "version": 1, step,
//                        cursor (examples consumed), tokens_seen, job (the
//                        settings that must match to resume)}
//   trainable.safetensors  the trainable tensors (LoRA A/B or all weights)
//   optimizer.pt        the AdamW state (LibTorch archive)
//   rng.safetensors     the generators' states (CPU, and CUDA when used)
//   COMPLETE            written last: a folder without it is not a checkpoint
// It is written under a temporary name, fsynced and renamed; only the newest
// `keep` are kept.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/status.h"

namespace trainerd::engine {

struct CheckpointState {
  int64_t step = 0;         // optimizer steps completed
  int64_t cursor = 0;       // examples consumed from the (epoch-shuffled) stream
  int64_t tokens_seen = 0;  // non-padding tokens trained
  nlohmann::json job;       // settings a resume must match (see Trainer)
};

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Writes checkpoint-<state.step> under `checkpoints_dir` and prunes to the
// newest `keep`. Returns the final folder.
StatusOr<std::string> WriteCheckpoint(const std::string& checkpoints_dir, const CheckpointState& state,
                                      const NamedTensors& trainable, torch::optim::Optimizer& optimizer,
                                      const torch::Device& device, int64_t keep);

// The complete checkpoint with the highest step, if any.
std::optional<std::string> FindLatestCheckpoint(const std::string& checkpoints_dir);

// Restores a checkpoint into `trainable` (copied in place), `optimizer` and the
// generators. The caller compares state.job with its own before trusting it.
StatusOr<CheckpointState> ReadCheckpoint(const std::string& path, const NamedTensors& trainable,
                                         torch::optim::Optimizer& optimizer, const torch::Device& device);

}  // namespace trainerd::engine
