#include "engine/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include <ATen/Context.h>

#include "engine/durable_files.h"
#include "engine/tensor_io.h"

namespace trainerd::engine {
namespace fs = std::filesystem;

namespace {

constexpr char kFormat[] = "trainerd-checkpoint";
constexpr int kVersion = 1;
constexpr char kPrefix[] = "checkpoint-";

// Step number of a folder named checkpoint-<step>, or -1.
int64_t StepOf(const fs::path& dir) {
  const std::string name = dir.filename().string();
  if (name.rfind(kPrefix, 0) != 0) return -1;
  const std::string digits = name.substr(sizeof(kPrefix) - 1);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

std::vector<std::pair<int64_t, fs::path>> CompleteCheckpoints(const std::string& checkpoints_dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir, ec)) {
    const int64_t step = StepOf(entry.path());
    if (step >= 0 && fs::exists(entry.path() / "COMPLETE")) found.emplace_back(step, entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<at::Generator> Generators(const torch::Device& device) {
  std::vector<at::Generator> gens = {at::detail::getDefaultCPUGenerator()};
  if (device.is_cuda()) gens.push_back(at::globalContext().defaultGenerator(device));
  return gens;
}

}  // namespace

StatusOr<std::string> WriteCheckpoint(const std::string& checkpoints_dir, const CheckpointState& state,
                                      const NamedTensors& trainable, torch::optim::Optimizer& optimizer,
                                      const torch::Device& device, int64_t keep) {
  const std::string name = kPrefix + std::to_string(state.step);
  TRAINERD_ASSIGN_OR_RETURN(std::string staging, MakeStagingDirectory(checkpoints_dir, name));
  auto fail = [&](const Status& s) {
    (void)RemoveTree(staging);  // best effort: the write error is what matters
    return s.WithContext("writing checkpoint " + name);
  };
  nlohmann::json meta = {{"format", kFormat}, {"version", kVersion},     {"step", state.step},
                         {"cursor", state.cursor}, {"tokens_seen", state.tokens_seen}, {"job", state.job}};
  Status s = WriteFileAtomically((fs::path(staging) / "state.json").string(), meta.dump(1) + "\n");
  if (!s.ok()) return fail(s);
  s = WriteTorchSafetensors((fs::path(staging) / "trainable.safetensors").string(), trainable);
  if (!s.ok()) return fail(s);
  try {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    archive.save_to((fs::path(staging) / "optimizer.pt").string());
  } catch (const std::exception& e) {
    return fail(Status::Error(std::string("saving the optimizer: ") + e.what()));
  }
  NamedTensors rng;
  int i = 0;
  for (at::Generator& gen : Generators(device)) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng.emplace_back("generator." + std::to_string(i++), gen.get_state());
  }
  s = WriteTorchSafetensors((fs::path(staging) / "rng.safetensors").string(), rng);
  if (!s.ok()) return fail(s);
  s = WriteFileAtomically((fs::path(staging) / "COMPLETE").string(), "");
  if (!s.ok()) return fail(s);
  const std::string final_path = (fs::path(checkpoints_dir) / name).string();
  s = CommitDirectory(staging, final_path);
  if (!s.ok()) return fail(s);

  auto all = CompleteCheckpoints(checkpoints_dir);
  for (size_t k = 0; k + keep < all.size(); ++k) {
    TRAINERD_RETURN_IF_ERROR(RemoveTree(all[k].second.string()).WithContext("pruning old checkpoints"));
  }
  return final_path;
}

std::optional<std::string> FindLatestCheckpoint(const std::string& checkpoints_dir) {
  auto all = CompleteCheckpoints(checkpoints_dir);
  if (all.empty()) return std::nullopt;
  return all.back().second.string();
}

StatusOr<CheckpointState> ReadCheckpoint(const std::string& path, const NamedTensors& trainable,
                                         torch::optim::Optimizer& optimizer, const torch::Device& device) {
  const std::string state_path = (fs::path(path) / "state.json").string();
  std::ifstream in(state_path);
  nlohmann::json meta = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object() || meta.value("format", "") != kFormat) {
    return Status::Error(state_path + ": not a trainerd checkpoint");
  }
  if (meta.value("version", 0) != kVersion) {
    return Status::Error(state_path + ": checkpoint format version " + meta["version"].dump() +
                         " is not supported by this trainerd (it reads version " + std::to_string(kVersion) + ")");
  }
  CheckpointState state;
  state.step = meta.value("step", int64_t{0});
  state.cursor = meta.value("cursor", int64_t{0});
  state.tokens_seen = meta.value("tokens_seen", int64_t{0});
  state.job = meta.value("job", nlohmann::json::object());

  const std::string weights_path = (fs::path(path) / "trainable.safetensors").string();
  TRAINERD_ASSIGN_OR_RETURN(auto saved, ReadSafetensors(weights_path));
  if (saved.size() != trainable.size()) {
    return Status::Error(weights_path + ": holds " + std::to_string(saved.size()) + " tensors, the job trains " +
                         std::to_string(trainable.size()));
  }
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, tensor] : trainable) {
      auto it = saved.find(name);
      if (it == saved.end()) return Status::Error(weights_path + ": tensor " + name + " is missing");
      if (it->second.sizes() != tensor.sizes()) {
        return Status::Error(weights_path + ": tensor " + name + " has another shape than the job's");
      }
      tensor.copy_(it->second);
    }
  }
  try {
    torch::serialize::InputArchive archive;
    archive.load_from((fs::path(path) / "optimizer.pt").string(), device);  // state beside its parameters
    optimizer.load(archive);
  } catch (const std::exception& e) {
    return Status::Error(path + "/optimizer.pt: cannot be loaded: " + std::string(e.what()).substr(0, 300));
  }
  const std::string rng_path = (fs::path(path) / "rng.safetensors").string();
  TRAINERD_ASSIGN_OR_RETURN(auto rng, ReadSafetensors(rng_path));
  int i = 0;
  for (at::Generator& gen : Generators(device)) {
    auto it = rng.find("generator." + std::to_string(i++));
    if (it == rng.end()) continue;  // e.g. written on the CPU, resumed on CUDA
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(it->second);
  }
  return state;
}

}  // namespace trainerd::engine
