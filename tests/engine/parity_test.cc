// Parity with Hugging Face transformers + PEFT on fixtures they generated
// (tools/make_fixtures.py): logits, eval loss, LoRA logits, LoRA training
// from a saved PEFT init, full fine-tuning, and adapters/merged models we
// write. Runs on TRAINERD_TEST_DEVICE / TRAINERD_TEST_DTYPE (test_support.h).
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/llama_model.h"
#include "engine/lora.h"
#include "engine/model_config.h"
#include "engine/tensor_io.h"
#include "tests/engine/test_support.h"

namespace trainerd::testing {
namespace {

using engine::LlamaModel;

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::unique_ptr<LlamaModel> LoadFixtureModel(const std::string& model_dir) {
  auto config = engine::LoadModelConfig(model_dir);
  EXPECT_TRUE(config.ok()) << config.status().message();
  auto weights = engine::LoadModelWeights(model_dir, TorchTestDtype(), TorchTestDevice());
  EXPECT_TRUE(weights.ok()) << weights.status().message();
  auto model = LlamaModel::FromWeights(*config, std::move(*weights), model_dir);
  EXPECT_TRUE(model.ok()) << model.status().message();
  return std::move(*model);
}

torch::Tensor LogitsOf(const LlamaModel& model, const torch::Tensor& ids) {
  torch::NoGradGuard no_grad;
  return model.Logits(model.Hidden(ids.to(model.device()))).to(torch::kCPU, torch::kFloat32);
}

class ParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string Dir(const std::string& rel = "") const { return Fixture(GetParam() + (rel.empty() ? "" : "/" + rel)); }
};

TEST_P(ParityTest, LogitsMatchTransformers) {
  auto model = LoadFixtureModel(Dir("model"));
  auto ref = engine::ReadSafetensors(Dir("reference.safetensors"));
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  torch::Tensor logits = LogitsOf(*model, ref->at("input_ids"));
  EXPECT_LE(Report(GetParam() + " logits rel err", RelativeError(logits, ref->at("logits"))), TestTolerances().logits);
}

TEST_P(ParityTest, LoraLogitsMatchPeft) {
  auto model = LoadFixtureModel(Dir("model"));
  auto settings = engine::ReadPeftAdapterConfig(Dir("adapter"));
  ASSERT_TRUE(settings.ok()) << settings.status().message();
  engine::AttachLora(*model, *settings);
  Status s = engine::LoadPeftAdapterWeights(*model, Dir("adapter"));
  ASSERT_TRUE(s.ok()) << s.message();
  auto ref = engine::ReadSafetensors(Dir("reference.safetensors"));
  ASSERT_TRUE(ref.ok());
  torch::Tensor logits = LogitsOf(*model, ref->at("input_ids"));
  EXPECT_LE(Report(GetParam() + " lora logits rel err", RelativeError(logits, ref->at("lora_logits"))),
            TestTolerances().logits);
  // The adapter must matter: without it the logits are the base model's.
  EXPECT_GT(RelativeError(logits, ref->at("logits")), 1e-3);
}

std::string EvalSpec(const std::string& model, const std::string& data, const std::string& out,
                     const std::string& adapter_init) {
  std::string yaml = "task: eval\nmodel:\n  path: " + model + "\n  dtype: " + TestDtype() +
                     "\ndata:\n  eval: " + data + "\n  max_seq_len: 64\ntraining:\n  micro_batch_size: 4\n"
                     "output:\n  dir: " + out + "\ndevice: " + TestDevice() + "\n";
  if (!adapter_init.empty()) yaml += "adapter:\n  init: " + adapter_init + "\n";
  return yaml;
}

TEST_P(ParityTest, EvalLossMatchesTransformers) {
  TempDir tmp;
  const auto ref = ReadJson(Dir("reference.json"));
  for (bool with_adapter : {false, true}) {
    const std::string out = tmp / (with_adapter ? "lora" : "base");
    JobSpec spec = SpecFromYaml(EvalSpec(Dir("model"), Dir("eval.jsonl"), out, with_adapter ? Dir("adapter") : ""),
                                tmp.path());
    RecordingReporter reporter;
    auto result = engine::RunJob(spec, {}, reporter);
    ASSERT_TRUE(result.ok()) << result.status().message();
    const double expected = ref[with_adapter ? "lora_eval_loss" : "eval_loss"].get<double>();
    EXPECT_LE(Report(GetParam() + (with_adapter ? " lora" : "") + " eval loss rel err",
                     std::abs(result->eval_loss - expected) / expected),
              TestTolerances().loss);
    EXPECT_EQ(result->eval_tokens, ref["eval_tokens"].get<int64_t>());
    const auto metrics = ReadJson(out + "/metrics.json");
    EXPECT_DOUBLE_EQ(metrics["eval_loss"].get<double>(), result->eval_loss);
    EXPECT_NEAR(metrics["perplexity"].get<double>(), std::exp(result->eval_loss), 1e-9 * std::exp(result->eval_loss));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ParityTest, ::testing::Values("llama", "mistral", "qwen2"));

// The hyperparameters the fixture trained with, as a job spec.
std::string TrainSpec(const nlohmann::json& hp, const std::string& model, const std::string& data,
                      const std::string& out, const std::string& adapter_block) {
  std::string yaml = "task: finetune\nmodel:\n  path: " + model + "\n  dtype: " + TestDtype() + "\n" + adapter_block +
                     "data:\n  train: " + data + "\n  shuffle: false\n  max_seq_len: " + hp["max_seq_len"].dump() +
                     "\ntraining:\n";
  for (const char* key : {"micro_batch_size", "gradient_accumulation_steps", "learning_rate", "warmup_steps",
                          "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "max_steps"}) {
    yaml += std::string("  ") + key + ": " + hp[key].dump() + "\n";
  }
  yaml += "  lr_scheduler: " + hp["lr_scheduler"].get<std::string>() + "\n  log_every: 1\n";
  yaml += "output:\n  dir: " + out + "\ndevice: " + TestDevice() + "\n";
  return yaml;
}

void ExpectStepsMatch(const RecordingReporter& reporter, const nlohmann::json& steps) {
  ASSERT_EQ(reporter.progress.size(), steps.size());
  const double tol = TestTolerances().train_loss;
  double worst = 0;
  for (size_t i = 0; i < std::min(steps.size(), reporter.progress.size()); ++i) {
    const double loss = steps[i]["loss"].get<double>();
    worst = std::max(worst, std::abs(reporter.progress[i].loss - loss) / loss);
  }
  Report("worst step loss rel err over " + std::to_string(steps.size()) + " steps", worst);
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& want = steps[i];
    const auto& got = reporter.progress[i];
    EXPECT_EQ(got.step, want["step"].get<int64_t>());
    const double loss = want["loss"].get<double>();
    EXPECT_LE(std::abs(got.loss - loss) / loss, tol) << "step " << got.step << ": " << got.loss << " vs " << loss;
    EXPECT_NEAR(got.lr, want["lr"].get<double>(), 1e-12) << "step " << got.step;
    const double gn = want["grad_norm"].get<double>();
    EXPECT_LE(std::abs(got.grad_norm - gn) / gn, 10 * tol) << "step " << got.step;
  }
}

TEST(TrainingParity, LoraStepsMatchPeftFromSavedInit) {
  TempDir tmp;
  const std::string dir = Fixture("llama/lora_train");
  const auto fixture = ReadJson(dir + "/steps.json");
  const std::string adapter = "adapter:\n  init: " + dir + "/init_adapter\n  dropout: 0.0\n";
  JobSpec spec = SpecFromYaml(
      TrainSpec(fixture["hyperparameters"], Fixture("llama/model"), dir + "/train.jsonl", tmp / "out", adapter),
      tmp.path());
  RecordingReporter reporter;
  auto result = engine::RunJob(spec, {}, reporter);
  ASSERT_TRUE(result.ok()) << result.status().message();
  ExpectStepsMatch(reporter, fixture["steps"]);

  // The trained adapter equals PEFT's after the same 12 steps.
  auto ours = engine::ReadSafetensors(tmp / "out/adapter/adapter_model.safetensors");
  auto theirs = engine::ReadSafetensors(dir + "/final_adapter/adapter_model.safetensors");
  ASSERT_TRUE(ours.ok() && theirs.ok());
  ASSERT_EQ(ours->size(), theirs->size());
  for (const auto& [name, t] : *theirs) {
    ASSERT_TRUE(ours->count(name)) << name;
    EXPECT_LE(RelativeError(ours->at(name), t), 100 * TestTolerances().train_loss) << name;
  }

  // For tools/check_peft_load.py: our adapter and the logits it gives here,
  // which PEFT must reproduce from the adapter folder alone.
  if (const char* check_dir = std::getenv("TRAINERD_PEFT_CHECK_DIR")) {
    auto model = LoadFixtureModel(Fixture("llama/model"));
    auto settings = engine::ReadPeftAdapterConfig(tmp / "out/adapter");
    ASSERT_TRUE(settings.ok());
    engine::AttachLora(*model, *settings);
    ASSERT_TRUE(engine::LoadPeftAdapterWeights(*model, tmp / "out/adapter").ok());
    auto ref = engine::ReadSafetensors(Fixture("llama/reference.safetensors"));
    ASSERT_TRUE(ref.ok());
    fs::create_directories(check_dir);
    fs::copy(tmp / "out/adapter", std::string(check_dir) + "/adapter", fs::copy_options::recursive);
    ASSERT_TRUE(engine::WriteTorchSafetensors(std::string(check_dir) + "/logits.safetensors",
                                              {{"input_ids", ref->at("input_ids")},
                                               {"logits", LogitsOf(*model, ref->at("input_ids"))}})
                    .ok());
  }
}

TEST(TrainingParity, FullFineTuningStepsMatchTransformers) {
  TempDir tmp;
  const std::string dir = Fixture("qwen2/full_train");
  const auto fixture = ReadJson(dir + "/steps.json");
  JobSpec spec = SpecFromYaml(
      TrainSpec(fixture["hyperparameters"], Fixture("qwen2/model"), dir + "/train.jsonl", tmp / "out", ""), tmp.path());
  RecordingReporter reporter;
  auto result = engine::RunJob(spec, {}, reporter);
  ASSERT_TRUE(result.ok()) << result.status().message();
  ExpectStepsMatch(reporter, fixture["steps"]);
  // A full fine-tune writes a model folder that loads as the architecture it came from.
  EXPECT_TRUE(fs::exists(tmp / "out/model/config.json"));
  EXPECT_TRUE(fs::exists(tmp / "out/model/model.safetensors"));
  auto reloaded = engine::LoadModelConfig(tmp / "out/model");
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().message();
  EXPECT_EQ(reloaded->model_type, "qwen2");
}

// An adapter trainerd writes reads back as the same adapter, and a merged
// model gives the adapted model's logits.
TEST(AdapterOutputs, SavedAdapterAndMergedModelReproduceLogits) {
  TempDir tmp;
  auto model = LoadFixtureModel(Fixture("llama/model"));
  auto settings = engine::ReadPeftAdapterConfig(Fixture("llama/adapter"));
  ASSERT_TRUE(settings.ok());
  engine::AttachLora(*model, *settings);
  ASSERT_TRUE(engine::LoadPeftAdapterWeights(*model, Fixture("llama/adapter")).ok());
  auto ref = engine::ReadSafetensors(Fixture("llama/reference.safetensors"));
  ASSERT_TRUE(ref.ok());
  const torch::Tensor ids = ref->at("input_ids");
  const torch::Tensor adapted = LogitsOf(*model, ids);

  fs::create_directories(tmp / "adapter");
  ASSERT_TRUE(engine::WritePeftAdapter(*model, *settings, Fixture("llama/model"), tmp / "adapter").ok());
  const auto config = ReadJson(tmp / "adapter/adapter_config.json");
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], settings->r);
  auto again = LoadFixtureModel(Fixture("llama/model"));
  auto reread = engine::ReadPeftAdapterConfig(tmp / "adapter");
  ASSERT_TRUE(reread.ok()) << reread.status().message();
  EXPECT_EQ(reread->target_modules, settings->target_modules);
  engine::AttachLora(*again, *reread);
  ASSERT_TRUE(engine::LoadPeftAdapterWeights(*again, tmp / "adapter").ok());
  EXPECT_TRUE(torch::equal(LogitsOf(*again, ids), adapted));

  auto merged_config = engine::LoadModelConfig(Fixture("llama/model"));
  ASSERT_TRUE(merged_config.ok());
  auto merged = LlamaModel::FromWeights(*merged_config, [&] {
    std::map<std::string, torch::Tensor> w;
    for (auto& [name, t] : engine::MergedWeights(*model)) w[name] = t;
    return w;
  }(), "merged");
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  EXPECT_LE(RelativeError(LogitsOf(**merged, ids), adapted), TestTolerances().logits * 10);
}

}  // namespace
}  // namespace trainerd::testing
