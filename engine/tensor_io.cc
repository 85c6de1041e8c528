#include "engine/tensor_io.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

namespace trainerd::engine {
namespace fs = std::filesystem;

StatusOr<torch::ScalarType> ToScalarType(DType dtype, const std::string& where) {
  switch (dtype) {
    case DType::kF32: return torch::kFloat32;
    case DType::kF16: return torch::kFloat16;
    case DType::kBF16: return torch::kBFloat16;
    case DType::kF64: return torch::kFloat64;
    case DType::kI64: return torch::kInt64;
    case DType::kI32: return torch::kInt32;
    case DType::kI16: return torch::kInt16;
    case DType::kI8: return torch::kInt8;
    case DType::kU8: return torch::kUInt8;
    case DType::kBool: return torch::kBool;
  }
  return Status::Error(where + ": unsupported safetensors dtype");
}

StatusOr<DType> ToDType(torch::ScalarType type, const std::string& where) {
  switch (type) {
    case torch::kFloat32: return DType::kF32;
    case torch::kFloat16: return DType::kF16;
    case torch::kBFloat16: return DType::kBF16;
    case torch::kFloat64: return DType::kF64;
    case torch::kInt64: return DType::kI64;
    case torch::kInt32: return DType::kI32;
    case torch::kInt16: return DType::kI16;
    case torch::kInt8: return DType::kI8;
    case torch::kUInt8: return DType::kU8;
    case torch::kBool: return DType::kBool;
    default: break;
  }
  return Status::Error(where + ": tensor type " + std::string(c10::toString(type)) +
                       " cannot be stored in safetensors");
}

StatusOr<torch::Tensor> ToTorch(const TensorView& view, torch::ScalarType type,
                                const torch::Device& device) {
  TRAINERD_ASSIGN_OR_RETURN(torch::ScalarType stored, ToScalarType(view.dtype, view.name));
  auto options = torch::TensorOptions().dtype(stored);
  if (view.nbytes == 0) return torch::empty(view.shape, options.dtype(type).device(device));
  // from_blob does not take ownership and wants a mutable pointer; the view is
  // only read, and .to(copy=true) detaches the result from the mapping.
  const size_t element = dtype_size(view.dtype);
  if (reinterpret_cast<uintptr_t>(view.data) % element != 0) {
    // The format does not align tensors; copy unaligned bytes out first.
    torch::Tensor aligned = torch::empty(view.shape, options);
    std::memcpy(aligned.data_ptr(), view.data, view.nbytes);
    return aligned.to(device, type, /*non_blocking=*/false, /*copy=*/aligned.scalar_type() == type);
  }
  torch::Tensor mapped = torch::from_blob(const_cast<void*>(view.data), view.shape, options);
  return mapped.to(device, type, /*non_blocking=*/false, /*copy=*/true);
}

StatusOr<std::map<std::string, torch::Tensor>> ReadSafetensors(const std::string& path) {
  TRAINERD_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  std::map<std::string, torch::Tensor> out;
  for (const TensorView& view : file->tensors()) {
    TRAINERD_ASSIGN_OR_RETURN(torch::ScalarType type, ToScalarType(view.dtype, path + ": " + view.name));
    TRAINERD_ASSIGN_OR_RETURN(torch::Tensor t, ToTorch(view, type, torch::kCPU));
    out.emplace(view.name, std::move(t));
  }
  return out;
}

Status WriteTorchSafetensors(const std::string& path,
                             const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  std::vector<torch::Tensor> keep;  // owns the CPU copies while writing
  std::vector<TensorToWrite> views;
  keep.reserve(tensors.size());
  views.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    TRAINERD_ASSIGN_OR_RETURN(DType dtype, ToDType(tensor.scalar_type(), path + ": " + name));
    torch::Tensor cpu = tensor.detach().to(torch::kCPU).contiguous();
    keep.push_back(cpu);
    views.push_back(TensorToWrite{name, dtype, cpu.sizes().vec(), cpu.data_ptr(),
                                  static_cast<size_t>(cpu.numel()) * cpu.element_size()});
  }
  return WriteSafetensors(path, views, metadata);
}

namespace {

// The files holding a model's weights, in a stable order.
StatusOr<std::vector<std::string>> WeightFiles(const std::string& model_dir) {
  fs::path dir(model_dir);
  fs::path single = dir / "model.safetensors";
  fs::path index = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(single, ec)) return std::vector<std::string>{single.string()};
  if (!fs::exists(index, ec)) {
    if (fs::exists(dir / "pytorch_model.bin", ec) || fs::exists(dir / "pytorch_model.bin.index.json", ec)) {
      return Status::Error(model_dir +
                           ": has only pytorch_model.bin weights; trainerd reads safetensors. "
                           "Convert with transformers: AutoModelForCausalLM.from_pretrained(dir)"
                           ".save_pretrained(dir)");
    }
    return Status::Error(model_dir + ": no model.safetensors or model.safetensors.index.json; "
                         "model.path must be a Hugging Face model folder");
  }
  std::ifstream in(index);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return Status::Error(index.string() + ": not a valid index (expected an object with \"weight_map\")");
  }
  std::set<std::string> shards;
  for (auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) {
      return Status::Error(index.string() + ": weight_map[\"" + name + "\"] is not a file name");
    }
    std::string f = file.get<std::string>();
    if (f.find('/') != std::string::npos || f == ".." || f.empty()) {
      return Status::Error(index.string() + ": weight_map[\"" + name + "\"] names '" + f +
                           "', which is not a file in the model folder");
    }
    shards.insert(f);
  }
  std::vector<std::string> files;
  for (const auto& f : shards) {
    fs::path p = dir / f;
    if (!fs::exists(p, ec)) {
      return Status::Error(index.string() + " lists shard " + f + ", which is missing from " + model_dir);
    }
    files.push_back(p.string());
  }
  if (files.empty()) return Status::Error(index.string() + ": weight_map is empty");
  return files;
}

}  // namespace

StatusOr<std::map<std::string, torch::Tensor>> LoadModelWeights(const std::string& model_dir,
                                                                torch::ScalarType type,
                                                                const torch::Device& device) {
  TRAINERD_ASSIGN_OR_RETURN(std::vector<std::string> files, WeightFiles(model_dir));
  std::map<std::string, torch::Tensor> weights;
  for (const std::string& path : files) {
    TRAINERD_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    for (const TensorView& view : file->tensors()) {
      if (weights.count(view.name)) {
        return Status::Error(path + ": tensor " + view.name + " appears in more than one shard");
      }
      TRAINERD_ASSIGN_OR_RETURN(torch::Tensor t, ToTorch(view, type, device));
      weights.emplace(view.name, std::move(t));
    }
  }
  return weights;
}

}  // namespace trainerd::engine
