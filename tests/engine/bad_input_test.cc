// Bad input: each mistake a user can make with a model folder or data gets
// a clear error naming what and where, and leaves nothing half-written in
// output.dir. One test per failure mode, through RunJob as the worker calls it.
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/tensor_io.h"
#include "tests/engine/test_support.h"

namespace trainerd::testing {
namespace {

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = tmp_ / "model";
    fs::copy(Fixture("llama/model"), model_, fs::copy_options::recursive);
    data_ = Fixture("llama/lora_train/train.jsonl");
  }

  std::string Job() const {
    return "model:\n  path: " + model_ + "\nadapter:\n  r: 2\ndata:\n  train: " + data_ +
           "\ntraining:\n  max_steps: 3\n  micro_batch_size: 2\n  learning_rate: " + lr_ +
           "\noutput:\n  dir: " + out() + "\ndevice: cpu\n";
  }
  std::string out() const { return tmp_ / "out"; }

  // Runs the job, expects failure, checks that nothing was left in output.dir.
  std::string Fail() {
    RecordingReporter reporter;
    auto result = engine::RunJob(SpecFromYaml(Job(), tmp_.path()), {}, reporter);
    EXPECT_FALSE(result.ok());
    EXPECT_FALSE(fs::exists(out() + "/adapter"));
    EXPECT_TRUE(HiddenEntries(out()).empty());
    return result.ok() ? "" : result.status().message();
  }

  nlohmann::json Config() const {
    std::ifstream in(model_ + "/config.json");
    return nlohmann::json::parse(in);
  }
  void SetConfig(const nlohmann::json& j) const { WriteText(model_ + "/config.json", j.dump(2)); }

  std::map<std::string, torch::Tensor> Weights() const {
    auto w = engine::ReadSafetensors(model_ + "/model.safetensors");
    EXPECT_TRUE(w.ok());
    return *w;
  }
  void SetWeights(const std::map<std::string, torch::Tensor>& w) const {
    std::vector<std::pair<std::string, torch::Tensor>> v(w.begin(), w.end());
    ASSERT_TRUE(engine::WriteTorchSafetensors(model_ + "/model.safetensors", v).ok());
  }

  TempDir tmp_;
  std::string model_, data_, lr_ = "0.001";
};

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST_F(BadInputTest, MissingWeights) {
  fs::remove(model_ + "/model.safetensors");
  std::string e = Fail();
  EXPECT_HAS(e, "no model.safetensors");
  EXPECT_HAS(e, model_);
}

TEST_F(BadInputTest, TruncatedSafetensors) {
  const auto size = fs::file_size(model_ + "/model.safetensors");
  fs::resize_file(model_ + "/model.safetensors", size / 2);
  std::string e = Fail();
  EXPECT_HAS(e, "model.safetensors");
}

TEST_F(BadInputTest, HeaderThatLiesAboutOffsets) {
  // Rewrite one tensor's data_offsets so its byte count disagrees with its shape.
  std::string bytes;
  {
    std::ifstream in(model_ + "/model.safetensors", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  auto& t = header["model.norm.weight"];
  t["shape"] = {t["shape"][0].get<int64_t>() / 2};  // 64 -> 32: same header length
  std::string text = header.dump();
  text.resize(n, ' ');
  ASSERT_EQ(text.size(), n);
  bytes.replace(8, n, text);
  WriteText(model_ + "/model.safetensors", bytes);
  std::string e = Fail();
  EXPECT_HAS(e, "model.norm.weight");
}

TEST_F(BadInputTest, MissingTensor) {
  auto w = Weights();
  w.erase("model.layers.1.mlp.up_proj.weight");
  SetWeights(w);
  std::string e = Fail();
  EXPECT_HAS(e, "model.layers.1.mlp.up_proj.weight");
  EXPECT_HAS(e, "missing");
}

TEST_F(BadInputTest, ShapeDisagreesWithConfig) {
  auto j = Config();
  j["intermediate_size"] = 128;
  SetConfig(j);
  std::string e = Fail();
  EXPECT_HAS(e, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_HAS(e, "[160, 64]");
  EXPECT_HAS(e, "[128, 64]");
}

TEST_F(BadInputTest, UnsupportedModelType) {
  auto j = Config();
  j["model_type"] = "gpt2";
  SetConfig(j);
  std::string e = Fail();
  EXPECT_HAS(e, "gpt2");
  EXPECT_HAS(e, "config.json");
}

TEST_F(BadInputTest, UnsupportedRopeType) {
  auto j = Config();
  j["rope_parameters"]["rope_type"] = "yarn";
  SetConfig(j);
  std::string e = Fail();
  EXPECT_HAS(e, "yarn");
}

TEST_F(BadInputTest, TokenIdOutOfRange) {
  data_ = tmp_ / "bad.jsonl";
  WriteText(data_, "{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [4, 256, 6]}\n");
  std::string e = Fail();
  EXPECT_HAS(e, data_ + ":2");
  EXPECT_HAS(e, "input_ids[1] = 256");
}

TEST_F(BadInputTest, NanLossStopsTheRun) {
  auto w = Weights();
  w["model.norm.weight"][0] = std::numeric_limits<float>::quiet_NaN();
  SetWeights(w);
  std::string e = Fail();
  EXPECT_HAS(e, "step 1");
  EXPECT_HAS(e, "NaN");
}

TEST_F(BadInputTest, AdapterInitThatIsNotAnAdapter) {
  WriteText(tmp_ / "job.yaml", "");
  std::string job = Job();
  job.replace(job.find("adapter:\n  r: 2"), 15, "adapter:\n  init: " + model_);
  RecordingReporter reporter;
  auto result = engine::RunJob(SpecFromYaml(job, tmp_.path()), {}, reporter);
  ASSERT_FALSE(result.ok());
  EXPECT_HAS(result.status().message(), "adapter_config.json");
}

TEST_F(BadInputTest, MoreCheckpointedLayersThanTheModelHas) {
  const int64_t layers = Config()["num_hidden_layers"].get<int64_t>();
  std::string job = Job();
  job.replace(job.find("training:\n"), 10,
              "training:\n  gradient_checkpointing: true\n  gradient_checkpointing_layers: " +
                  std::to_string(layers + 1) + "\n");
  RecordingReporter reporter;
  auto result = engine::RunJob(SpecFromYaml(job, tmp_.path()), {}, reporter);
  ASSERT_FALSE(result.ok());
  EXPECT_HAS(result.status().message(), "training.gradient_checkpointing_layers " + std::to_string(layers + 1));
  EXPECT_HAS(result.status().message(), "use at most " + std::to_string(layers));
}

TEST_F(BadInputTest, CudaRequestedWithoutAGpu) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is present";
  std::string job = Job();
  job.replace(job.find("device: cpu"), 11, "device: cuda");
  RecordingReporter reporter;
  auto result = engine::RunJob(SpecFromYaml(job, tmp_.path()), {}, reporter);
  ASSERT_FALSE(result.ok());
  EXPECT_HAS(result.status().message(), "device: 'cuda'");
}

}  // namespace
}  // namespace trainerd::testing
