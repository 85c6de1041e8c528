// Bridges safetensors files and torch tensors, and the model folder's weights.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/status.h"
#include "engine/safetensors.h"

namespace trainerd::engine {

StatusOr<torch::ScalarType> ToScalarType(DType dtype, const std::string& where);
StatusOr<DType> ToDType(torch::ScalarType type, const std::string& where);

// Copies a mapped tensor to `device` as `type` (a new tensor owning its memory).
StatusOr<torch::Tensor> ToTorch(const TensorView& view, torch::ScalarType type,
                                const torch::Device& device);

// Reads every tensor of one safetensors file, keeping each stored dtype, on the CPU.
StatusOr<std::map<std::string, torch::Tensor>> ReadSafetensors(const std::string& path);

// Writes tensors (any device) atomically; each is made contiguous on the CPU
// first. Names must be unique.
Status WriteTorchSafetensors(const std::string& path,
                             const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                             const std::map<std::string, std::string>& metadata = {});

// The weights of a Hugging Face model folder: model.safetensors, or the shards
// listed in model.safetensors.index.json. Every tensor is converted to `type`
// on `device`; the files are memory-mapped and released once copied.
StatusOr<std::map<std::string, torch::Tensor>> LoadModelWeights(const std::string& model_dir,
                                                                torch::ScalarType type,
                                                                const torch::Device& device);

}  // namespace trainerd::engine
