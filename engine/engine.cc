// RunJob: resolves the device, loads the model (and adapter), the data, runs
// the trainer or the evaluation, and writes the outputs into output.dir.
#include "engine/engine.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "engine/durable_files.h"
#include "engine/hf_export.h"
#include "engine/llama_model.h"
#include "engine/lora.h"
#include "engine/micro_batch_probe.h"
#include "engine/model_config.h"
#include "engine/packing.h"
#include "engine/tensor_io.h"
#include "engine/text_dataset.h"
#include "engine/token_dataset.h"
#include "engine/trainer.h"

namespace trainerd::engine {
namespace fs = std::filesystem;

namespace {

struct Placement {
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat32;
  std::string dtype_name;
};

StatusOr<Placement> ResolvePlacement(const JobSpec& spec) {
  Placement p;
  const std::string& d = spec.device;
  if (d == "cpu") {
    p.device = torch::kCPU;
  } else if (d == "auto") {
    p.device = torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  } else {
    if (!torch::cuda::is_available()) {
      return Status::Error(spec.source + ": device: '" + d +
                           "' asks for a GPU but none is usable here (no CUDA device, or a CPU-only build); "
                           "use device: auto or cpu");
    }
    int64_t index = 0;
    if (d.size() > 5) index = std::stoll(d.substr(5));
    if (index >= static_cast<int64_t>(torch::cuda::device_count())) {
      return Status::Error(spec.source + ": device: '" + d + "' does not exist; this machine has " +
                           std::to_string(torch::cuda::device_count()) + " GPU(s)");
    }
    p.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  std::string dtype = spec.model.dtype;
  if (dtype == "auto") dtype = p.device.is_cuda() ? "bfloat16" : "float32";
  p.dtype_name = dtype;
  p.dtype = dtype == "bfloat16" ? torch::kBFloat16 : dtype == "float16" ? torch::kFloat16 : torch::kFloat32;
  return p;
}

std::string DeviceName(const torch::Device& d) { return d.str(); }

// The adapter settings: the spec's, or adapter.init's adapter_config.json
// (which must agree with whatever the spec sets explicitly).
StatusOr<LoraSettings> ResolveLoraSettings(const JobSpec& spec) {
  const AdapterSpec& a = *spec.adapter;
  LoraSettings s{a.r, a.alpha, a.dropout, a.target_modules, a.use_rslora};
  if (a.init.empty()) return s;
  TRAINERD_ASSIGN_OR_RETURN(LoraSettings init, ReadPeftAdapterConfig(a.init));
  auto conflict = [&](const std::string& key, const std::string& spec_value, const std::string& init_value) {
    return Status::Error(spec.source + ": adapter." + key + " is " + spec_value + " but adapter.init (" + a.init +
                         ") was trained with " + init_value + "; remove adapter." + key +
                         " from the spec or make them agree");
  };
  if (a.r_set && a.r != init.r) return conflict("r", std::to_string(a.r), std::to_string(init.r));
  if (a.alpha_set && a.alpha != init.alpha) return conflict("alpha", std::to_string(a.alpha), std::to_string(init.alpha));
  if (a.use_rslora_set && a.use_rslora != init.use_rslora) {
    return conflict("use_rslora", a.use_rslora ? "true" : "false", init.use_rslora ? "true" : "false");
  }
  if (a.target_modules_set) {
    std::vector<std::string> mine;
    for (const auto& m : AllLinearModules()) {
      if (std::find(a.target_modules.begin(), a.target_modules.end(), m) != a.target_modules.end()) mine.push_back(m);
    }
    if (mine != init.target_modules) {
      return conflict("target_modules", nlohmann::json(mine).dump(), nlohmann::json(init.target_modules).dump());
    }
  }
  // Dropout is a training choice, not part of the adapter: the spec's wins when set.
  if (a.dropout_set) init.dropout = a.dropout;
  return init;
}

struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<LlamaModel> model;
  std::optional<LoraSettings> lora;
};

StatusOr<LoadedModel> LoadModel(const JobSpec& spec, const Placement& place) {
  LoadedModel m;
  TRAINERD_ASSIGN_OR_RETURN(m.config, LoadModelConfig(spec.model.path));
  if (m.config.sliding_window && *m.config.sliding_window < spec.data.max_seq_len &&
      m.config.sliding_window_first_layer < m.config.num_hidden_layers) {
    return Status::Error(spec.model.path + "/config.json: sliding_window " + std::to_string(*m.config.sliding_window) +
                         " is shorter than data.max_seq_len " + std::to_string(spec.data.max_seq_len) +
                         "; sliding-window attention is not supported: lower data.max_seq_len to at most the window");
  }
  if (spec.training.gradient_checkpointing_layers > m.config.num_hidden_layers) {
    return Status::Error(spec.source + ": training.gradient_checkpointing_layers " +
                         std::to_string(spec.training.gradient_checkpointing_layers) + " is more than the " +
                         std::to_string(m.config.num_hidden_layers) + " decoder layers of " + spec.model.path +
                         " (config.json num_hidden_layers); use at most " +
                         std::to_string(m.config.num_hidden_layers) + ", or remove it to recompute every layer");
  }
  TRAINERD_ASSIGN_OR_RETURN(auto weights, LoadModelWeights(spec.model.path, place.dtype, place.device));
  TRAINERD_ASSIGN_OR_RETURN(m.model, LlamaModel::FromWeights(m.config, std::move(weights), spec.model.path));
  if (spec.adapter) {
    TRAINERD_ASSIGN_OR_RETURN(LoraSettings s, ResolveLoraSettings(spec));
    AttachLora(*m.model, s);
    if (!spec.adapter->init.empty()) TRAINERD_RETURN_IF_ERROR(LoadPeftAdapterWeights(*m.model, spec.adapter->init));
    m.lora = s;
  }
  return m;
}

// Writes one output folder through a staging folder renamed into place.
template <typename Fill>
Status WriteOutputFolder(const std::string& final_path, Fill fill) {
  const fs::path p(final_path);
  TRAINERD_ASSIGN_OR_RETURN(std::string staging, MakeStagingDirectory(p.parent_path().string(), p.filename().string()));
  Status s = fill(staging);
  if (s.ok()) s = CommitDirectory(staging, final_path);
  if (!s.ok()) {
    (void)RemoveTree(staging);  // best effort: the error being returned matters more
  }
  return s.WithContext("writing " + final_path);
}

StatusOr<RunResult> RunEval(const JobSpec& spec, const Placement& place, Reporter& reporter) {
  TRAINERD_ASSIGN_OR_RETURN(LoadedModel m, LoadModel(spec, place));
  DatasetLoader data(DataOptionsFor(spec, m.config.vocab_size),
                     [&reporter](const std::string& note) { reporter.OnMessage(note); });
  TRAINERD_ASSIGN_OR_RETURN(TokenDataset eval, data.Load(spec.data.eval));
  RunInfo info;
  info.device = DeviceName(place.device);
  info.dtype = place.dtype_name;
  info.model_type = m.config.model_type;
  for (const auto& [_, t] : m.model->NamedWeights()) info.total_params += t.numel();
  info.truncated_examples = eval.truncated;
  info.dropped_examples = eval.dropped;
  reporter.OnStart(info);
  EvalResult r = Evaluate(*m.model, eval, spec.training.micro_batch_size);
  reporter.OnEval(EvalEvent{0, r.loss, r.tokens});
  nlohmann::json metrics = {{"eval_loss", r.loss}, {"eval_tokens", r.tokens}, {"perplexity", std::exp(r.loss)},
                            {"examples", eval.examples.size()}, {"dropped_examples", eval.dropped},
                            {"truncated_examples", eval.truncated}};
  std::error_code ec;
  fs::create_directories(spec.output.dir, ec);
  if (ec) return Status::Error("creating output.dir " + spec.output.dir + ": " + ec.message());
  const std::string path = (fs::path(spec.output.dir) / "metrics.json").string();
  TRAINERD_RETURN_IF_ERROR(WriteFileAtomically(path, metrics.dump(2) + "\n"));
  RunResult result;
  result.eval_loss = r.loss;
  result.eval_tokens = r.tokens;
  result.output_path = path;
  return result;
}

// micro_batch_size: auto. A resumed run keeps the size its checkpoint was
// written with (the resume checks it); a fresh one probes the device.
StatusOr<int64_t> ResolveAutoMicroBatch(const JobSpec& spec, const RunOptions& options, LlamaModel& model,
                                        const TokenDataset& train, const NamedTensors& trainable, Reporter& reporter) {
  if (options.resume) {
    if (auto latest = FindLatestCheckpoint((fs::path(spec.output.dir) / "checkpoints").string())) {
      std::ifstream in((fs::path(*latest) / "state.json").string());
      const nlohmann::json meta = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (!meta.is_discarded() && meta.contains("job") && meta["job"].contains("training.micro_batch_size") &&
          meta["job"]["training.micro_batch_size"].is_number_integer()) {
        const int64_t size = meta["job"]["training.micro_batch_size"].get<int64_t>();
        reporter.OnMessage("training.micro_batch_size: auto: " + std::to_string(size) + ", as in " + *latest);
        return size;
      }
    }
  }
  TRAINERD_ASSIGN_OR_RETURN(MicroBatchChoice choice, FindMicroBatchSize(model, train, trainable));
  reporter.OnMessage("training.micro_batch_size: auto chose " + choice.explanation);
  return choice.micro_batch_size;
}

StatusOr<RunResult> RunFinetune(const JobSpec& spec, const RunOptions& options, const Placement& place,
                                Reporter& reporter) {
  TRAINERD_ASSIGN_OR_RETURN(LoadedModel m, LoadModel(spec, place));
  // data.format picks tokens or a text format (tokenized with model.path's tokenizer.json).
  DatasetLoader data(DataOptionsFor(spec, m.config.vocab_size),
                     [&reporter](const std::string& note) { reporter.OnMessage(note); });
  TRAINERD_ASSIGN_OR_RETURN(TokenDataset train, data.Load(spec.data.train));
  const TokenDataset::TokenCounts train_counts = train.CountTokens();  // before packing
  std::optional<TokenDataset> eval;
  if (!spec.data.eval.empty()) {
    TRAINERD_ASSIGN_OR_RETURN(eval, data.Load(spec.data.eval));
  }
  if (spec.data.packing) {
    const size_t examples = train.examples.size();
    train = PackExamples(train, spec.data.max_seq_len);
    if (eval) eval = PackExamples(*eval, spec.data.max_seq_len);
    reporter.OnMessage("data.packing: " + std::to_string(examples) + " training examples packed into " +
                       std::to_string(train.examples.size()) + " sequences of at most " +
                       std::to_string(spec.data.max_seq_len) + " tokens");
  }
  NamedTensors trainable;
  if (m.lora) {
    trainable = LoraNamedParameters(*m.model);
  } else {
    trainable = m.model->NamedWeights();
    for (auto& [_, t] : trainable) t.set_requires_grad(true);
  }
  m.model->set_gradient_checkpointing(spec.training.gradient_checkpointing,
                                      spec.training.gradient_checkpointing_layers);
  JobSpec run_spec = spec;  // with micro_batch_size resolved when it is auto
  if (spec.training.micro_batch_size_auto) {
    TRAINERD_ASSIGN_OR_RETURN(run_spec.training.micro_batch_size,
                              ResolveAutoMicroBatch(spec, options, *m.model, train, trainable, reporter));
  }
  Trainer trainer(run_spec, *m.model, trainable, train, eval ? &*eval : nullptr, reporter);

  RunInfo info;
  info.device = DeviceName(place.device);
  info.dtype = place.dtype_name;
  info.model_type = m.config.model_type;
  for (const auto& [_, t] : m.model->NamedWeights()) info.total_params += t.numel();
  for (const auto& [_, t] : trainable) info.trainable_params += t.numel();
  if (m.lora) info.total_params += info.trainable_params;
  info.train_examples = static_cast<int64_t>(train.examples.size());
  info.train_tokens = train_counts.tokens;
  info.trained_tokens = train_counts.trained;
  info.dropped_examples = train.dropped;
  info.truncated_examples = train.truncated;
  info.total_steps = trainer.total_steps();
  if (options.resume) {
    if (auto latest = FindLatestCheckpoint((fs::path(spec.output.dir) / "checkpoints").string())) {
      info.resumed_from_step = std::stoll(fs::path(*latest).filename().string().substr(11));
    }
  }
  reporter.OnStart(info);

  TRAINERD_ASSIGN_OR_RETURN(RunResult result, trainer.Run(options));
  if (result.stopped) return result;

  const ModelConfig& config = m.config;
  if (m.lora) {
    result.output_path = (fs::path(spec.output.dir) / "adapter").string();
    TRAINERD_RETURN_IF_ERROR(WriteOutputFolder(result.output_path, [&](const std::string& dir) {
      return WritePeftAdapter(*m.model, *m.lora, spec.model.path, dir);
    }));
    if (spec.output.merge) {
      TRAINERD_RETURN_IF_ERROR(WriteOutputFolder((fs::path(spec.output.dir) / "merged").string(), [&](const std::string& dir) {
        return WriteModelFolder(config, MergedWeights(*m.model), place.dtype_name, spec.model.path, dir);
      }));
    }
  } else {
    result.output_path = (fs::path(spec.output.dir) / "model").string();
    TRAINERD_RETURN_IF_ERROR(WriteOutputFolder(result.output_path, [&](const std::string& dir) {
      return WriteModelFolder(config, m.model->NamedWeights(), place.dtype_name, spec.model.path, dir);
    }));
  }
  return result;
}

}  // namespace

StatusOr<RunResult> RunJob(const JobSpec& spec, const RunOptions& options, Reporter& reporter) {
  try {
    TRAINERD_RETURN_IF_ERROR(StepProfiler::Check(options.profile));
    TRAINERD_ASSIGN_OR_RETURN(Placement place, ResolvePlacement(spec));
    torch::manual_seed(spec.training.seed);
    if (spec.task == "eval") return RunEval(spec, place, reporter);
    return RunFinetune(spec, options, place, reporter);
  } catch (const c10::Error& e) {
    // LibTorch failures (CUDA out of memory, a kernel error) end the job, not the process.
    return Status::Error("LibTorch error: " + std::string(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return Status::Error(std::string("internal error: ") + e.what());
  }
}

std::vector<std::string> CudaDevices() {
  std::vector<std::string> devices;
  if (!torch::cuda::is_available()) return devices;
  const auto count = static_cast<int64_t>(torch::cuda::device_count());
  for (int64_t i = 0; i < count; ++i) devices.push_back("cuda:" + std::to_string(i));
  return devices;
}

}  // namespace trainerd::engine
