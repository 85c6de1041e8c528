#include "engine/lora.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "common/job_spec.h"
#include "engine/tensor_io.h"

namespace trainerd::engine {
namespace fs = std::filesystem;

namespace {
const char kPeftPrefix[] = "base_model.model.";
}

double LoraSettings::scaling() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

void AttachLora(LlamaModel& model, const LoraSettings& settings) {
  torch::NoGradGuard no_grad;
  auto options = torch::TensorOptions().dtype(torch::kFloat32).device(model.device());
  for (DecoderLayer& layer : model.layers()) {
    for (const std::string& target : settings.target_modules) {
      Linear* linear = layer.Module(target);
      const int64_t in = linear->weight.size(1), out = linear->weight.size(0);
      LoraWeights w;
      w.a = torch::empty({settings.r, in}, options);
      torch::nn::init::kaiming_uniform_(w.a, std::sqrt(5.0));
      w.b = torch::zeros({out, settings.r}, options);
      w.a.set_requires_grad(true);
      w.b.set_requires_grad(true);
      w.scaling = settings.scaling();
      w.dropout = settings.dropout;
      linear->lora = std::move(w);
    }
  }
  model.WidenLinearGroups();
}

StatusOr<LoraSettings> ReadPeftAdapterConfig(const std::string& adapter_dir) {
  const std::string path = (fs::path(adapter_dir) / "adapter_config.json").string();
  std::ifstream in(path);
  if (!in) return Status::Error(path + ": cannot open (adapter.init must be a PEFT adapter folder)");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Error(path + ": not a JSON object");
  auto fail = [&](const std::string& key, const std::string& why) {
    return Status::Error(path + ": " + key + ": " + why);
  };
  if (j.value("peft_type", std::string()) != "LORA") {
    return fail("peft_type", "expected \"LORA\"; only LoRA adapters are supported");
  }
  LoraSettings s;
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() < 1) {
    return fail("r", "expected a positive integer");
  }
  s.r = j["r"].get<int64_t>();
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number()) return fail("lora_alpha", "expected a number");
  s.alpha = j["lora_alpha"].get<double>();
  if (j.contains("lora_dropout") && j["lora_dropout"].is_number()) s.dropout = j["lora_dropout"].get<double>();
  if (j.contains("use_rslora") && j["use_rslora"].is_boolean()) s.use_rslora = j["use_rslora"].get<bool>();
  const auto& targets = j.value("target_modules", nlohmann::json());
  if (targets.is_string() && targets.get<std::string>() == "all-linear") {
    s.target_modules = AllLinearModules();
  } else if (targets.is_array()) {
    // Keep the canonical order so that the same set gives the same adapter.
    std::set<std::string> given;
    for (const auto& t : targets) {
      if (!t.is_string()) return fail("target_modules", "expected a list of module names");
      std::string name = t.get<std::string>();
      if (std::find(AllLinearModules().begin(), AllLinearModules().end(), name) == AllLinearModules().end()) {
        return fail("target_modules", "'" + name + "' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
      }
      given.insert(name);
    }
    for (const auto& m : AllLinearModules()) if (given.count(m)) s.target_modules.push_back(m);
    if (s.target_modules.empty()) return fail("target_modules", "is empty");
  } else {
    return fail("target_modules", "expected a list of module names or \"all-linear\" (regular expressions are not supported)");
  }
  auto require_empty = [&](const char* key) -> Status {
    if (j.contains(key) && !j[key].is_null() && !j[key].empty()) {
      return fail(key, "is set; trainerd supports uniform adapters only");
    }
    return Status::Ok();
  };
  for (const char* key : {"rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform",
                          "layer_replication", "trainable_token_indices"}) {
    TRAINERD_RETURN_IF_ERROR(require_empty(key));
  }
  if (j.value("use_dora", false)) return fail("use_dora", "DoRA adapters are not supported");
  if (j.contains("bias") && j["bias"] != "none") return fail("bias", "only \"none\" is supported");
  if (j.value("fan_in_fan_out", false)) return fail("fan_in_fan_out", "not supported for Llama-family models");
  return s;
}

std::vector<std::pair<std::string, torch::Tensor>> LoraNamedParameters(const LlamaModel& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const DecoderLayer& layer : model.layers()) {
    for (const Linear* l : layer.Modules()) {
      if (!l->lora) continue;
      out.emplace_back(kPeftPrefix + l->name + ".lora_A.weight", l->lora->a);
      out.emplace_back(kPeftPrefix + l->name + ".lora_B.weight", l->lora->b);
    }
  }
  return out;
}

Status LoadPeftAdapterWeights(LlamaModel& model, const std::string& adapter_dir) {
  const std::string path = (fs::path(adapter_dir) / "adapter_model.safetensors").string();
  if (!fs::exists(path)) {
    return Status::Error(path + ": missing (adapter.init must hold adapter_model.safetensors; "
                         "adapter_model.bin is not supported)");
  }
  TRAINERD_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  std::set<std::string> expected;
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : LoraNamedParameters(model)) {
    expected.insert(name);
    const TensorView* view = file->Find(name);
    if (!view) return Status::Error(path + ": tensor " + name + " is missing");
    if (view->shape != tensor.sizes().vec()) {
      return Status::Error(path + ": tensor " + name + " has the wrong shape for this model and adapter_config.json");
    }
    TRAINERD_ASSIGN_OR_RETURN(torch::Tensor loaded, ToTorch(*view, tensor.scalar_type(), tensor.device()));
    tensor.copy_(loaded);
  }
  for (const TensorView& view : file->tensors()) {
    if (!expected.count(view.name)) {
      return Status::Error(path + ": unexpected tensor " + view.name +
                           " (not a LoRA A/B of a module listed in adapter_config.json)");
    }
  }
  return Status::Ok();
}

Status WritePeftAdapter(const LlamaModel& model, const LoraSettings& settings,
                        const std::string& base_model_path, const std::string& dir) {
  nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model_path},
      {"r", settings.r},
      {"lora_alpha", settings.alpha},
      {"lora_dropout", settings.dropout},
      {"target_modules", settings.target_modules},
      {"use_rslora", settings.use_rslora},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
      {"use_dora", false},
      {"revision", nullptr},
  };
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
  {
    std::ofstream out(config_path);
    out << config.dump(2) << "\n";
    if (!out.flush()) return Status::Error(config_path + ": write failed");
  }
  // PEFT saves the adapter in the dtype it trains in (float32).
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto& [name, t] : LoraNamedParameters(model)) tensors.emplace_back(name, t.detach());
  return WriteTorchSafetensors((fs::path(dir) / "adapter_model.safetensors").string(), tensors,
                               {{"format", "pt"}});
}

std::vector<std::pair<std::string, torch::Tensor>> MergedWeights(const LlamaModel& model) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> out = model.NamedWeights();
  std::map<std::string, const Linear*> adapted;
  for (const DecoderLayer& layer : model.layers()) {
    for (const Linear* l : layer.Modules()) {
      if (l->lora) adapted[l->name + ".weight"] = l;
    }
  }
  for (auto& [name, tensor] : out) {
    auto it = adapted.find(name);
    if (it == adapted.end()) continue;
    const LoraWeights& lora = *it->second->lora;
    torch::Tensor delta = torch::matmul(lora.b, lora.a) * lora.scaling;  // (out, in) float32
    tensor = (tensor.to(torch::kFloat32) + delta).to(tensor.scalar_type());
  }
  return out;
}

}  // namespace trainerd::engine
