#include "engine/hf_export.h"

#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "engine/durable_files.h"
#include "engine/tensor_io.h"

namespace trainerd::engine {
namespace fs = std::filesystem;

namespace {
const char* const kCopiedFiles[] = {"tokenizer.json",       "tokenizer_config.json", "special_tokens_map.json",
                                    "tokenizer.model",      "generation_config.json", "chat_template.jinja",
                                    "added_tokens.json",    "vocab.json",            "merges.txt"};

std::string ShardName(int i, int n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05d-of-%05d.safetensors", i, n);
  return buf;
}
}  // namespace

Status WriteModelFolder(const ModelConfig& config, const NamedTensors& weights, const std::string& dtype_name,
                        const std::string& source_dir, const std::string& dir) {
  nlohmann::json cfg = config.raw;
  if (cfg.contains("torch_dtype")) cfg["torch_dtype"] = dtype_name;
  cfg["dtype"] = dtype_name;
  TRAINERD_RETURN_IF_ERROR(WriteFileAtomically((fs::path(dir) / "config.json").string(), cfg.dump(2) + "\n"));

  std::vector<NamedTensors> shards(1);
  int64_t shard_bytes = 0, total_bytes = 0;
  for (const auto& named : weights) {
    const int64_t bytes = named.second.numel() * named.second.element_size();
    if (shard_bytes > 0 && shard_bytes + bytes > kMaxShardBytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(named);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (shards.size() == 1) {
    TRAINERD_RETURN_IF_ERROR(WriteTorchSafetensors((fs::path(dir) / "model.safetensors").string(), shards[0], meta));
  } else {
    nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", nlohmann::json::object()}};
    const int n = static_cast<int>(shards.size());
    for (int i = 0; i < n; ++i) {
      const std::string name = ShardName(i + 1, n);
      TRAINERD_RETURN_IF_ERROR(WriteTorchSafetensors((fs::path(dir) / name).string(), shards[i], meta));
      for (const auto& [tensor_name, _] : shards[i]) index["weight_map"][tensor_name] = name;
    }
    TRAINERD_RETURN_IF_ERROR(WriteFileAtomically((fs::path(dir) / "model.safetensors.index.json").string(),
                                                 index.dump(2) + "\n"));
  }
  for (const char* name : kCopiedFiles) {
    fs::path from = fs::path(source_dir) / name;
    std::error_code ec;
    if (!fs::exists(from, ec)) continue;
    fs::copy_file(from, fs::path(dir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return Status::Error("copying " + from.string() + " into " + dir + ": " + ec.message());
  }
  return Status::Ok();
}

}  // namespace trainerd::engine
