// LoRA adapters on a LlamaModel, in PEFT's conventions: initialisation,
// scaling, tensor names and the adapter folder format, so that an adapter
// saved here loads in PEFT unchanged and a PEFT adapter loads here.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "common/status.h"
#include "engine/llama_model.h"

namespace trainerd::engine {

struct LoraSettings {
  int64_t r = 8;
  double alpha = 16;
  double dropout = 0.0;
  std::vector<std::string> target_modules;  // short names: q_proj ... down_proj
  bool use_rslora = false;

  // alpha / r, or alpha / sqrt(r) with rsLoRA.
  double scaling() const;
};

// Attaches fresh adapters to every targeted linear layer with PEFT's default
// initialisation: A ~ kaiming_uniform(a=sqrt(5)) i.e. U(-1/sqrt(in), 1/sqrt(in)),
// B = 0, both float32 on the model's device and trainable. Draws from the
// default generator of the model's device. Then widens the model's linear
// groups for these adapters (LlamaModel::WidenLinearGroups).
void AttachLora(LlamaModel& model, const LoraSettings& settings);

// Reads a PEFT adapter folder's adapter_config.json. Rejects what the engine
// cannot reproduce (DoRA, rank/alpha patterns, regex targets, biases,
// layers_to_transform, modules_to_save), naming the key.
StatusOr<LoraSettings> ReadPeftAdapterConfig(const std::string& adapter_dir);

// Copies adapter_model.safetensors into adapters attached with the folder's
// settings. Every expected tensor must be present with its shape and nothing else.
Status LoadPeftAdapterWeights(LlamaModel& model, const std::string& adapter_dir);

// The trainable adapter tensors under PEFT's saved names
// (base_model.model.<module>.lora_A.weight), in a stable order.
std::vector<std::pair<std::string, torch::Tensor>> LoraNamedParameters(const LlamaModel& model);

// Writes adapter_config.json and adapter_model.safetensors into `dir` (which
// must exist and is normally a temporary folder renamed by the caller).
Status WritePeftAdapter(const LlamaModel& model, const LoraSettings& settings,
                        const std::string& base_model_path, const std::string& dir);

// W + scaling * B A for every adapted layer, in the model dtype, plus every
// other base tensor, under Hugging Face names (a merged model's weights).
std::vector<std::pair<std::string, torch::Tensor>> MergedWeights(const LlamaModel& model);

}  // namespace trainerd::engine
