#include "engine/model_config.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>

namespace trainerd::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// config.json of meta-llama/Llama-3.2-1B.
constexpr const char* kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// config.json of mistralai/Mistral-7B-v0.1.
constexpr const char* kMistral7B = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

// config.json of Qwen/Qwen2-0.5B.
constexpr const char* kQwen2_05B = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 131072,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "sliding_window": 131072,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Llama 3.2 1B as transformers 5 saves it: rope settings in rope_parameters,
// "dtype" instead of "torch_dtype".
constexpr const char* kLlama32_1B_Transformers5 = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "dtype": "bfloat16",
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_parameters": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rope_type": "llama3"
  },
  "tie_word_embeddings": true,
  "transformers_version": "5.0.0",
  "use_cache": true,
  "vocab_size": 128256
})";

// The smallest config this engine accepts.
json MinimalLlama() {
  return json{{"model_type", "llama"},  {"hidden_size", 256},       {"intermediate_size", 688},
              {"num_hidden_layers", 2}, {"num_attention_heads", 8}, {"vocab_size", 1000}};
}

using trainerd::testing::ExpectErrorContains;

using trainerd::testing::TempDir;

class ModelConfigTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed"; }

  // Writes `text` as <tmp>/config.json; returns the folder.
  std::string WriteConfig(const std::string& text) {
    std::ofstream(dir_.path() + "/config.json", std::ios::binary) << text;
    return dir_.path();
  }
  std::string ConfigPath() const { return dir_.path() + "/config.json"; }

  StatusOr<ModelConfig> Load(const std::string& text) { return LoadModelConfig(WriteConfig(text)); }
  static StatusOr<ModelConfig> Parse(const json& j) {
    return ParseModelConfig(j, "/m/config.json");
  }

  TempDir dir_;
};

TEST_F(ModelConfigTest, Llama32_1B) {
  auto c = Load(kLlama32_1B);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->intermediate_size, 8192);
  EXPECT_EQ(c->num_hidden_layers, 16);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_EQ(c->sliding_window, std::nullopt);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->raw, json::parse(kLlama32_1B));
}

TEST_F(ModelConfigTest, Mistral7Bv01) {
  auto c = Load(kMistral7B);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model_type, "mistral");
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->intermediate_size, 14336);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->sliding_window_first_layer, 0);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_FALSE(c->mlp_bias);
}

TEST_F(ModelConfigTest, Qwen2_05B) {
  auto c = Load(kQwen2_05B);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model_type, "qwen2");
  EXPECT_EQ(c->hidden_size, 896);
  EXPECT_EQ(c->num_attention_heads, 14);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_EQ(c->sliding_window, std::nullopt);  // use_sliding_window is false
}

TEST_F(ModelConfigTest, Transformers5RopeParameters) {
  auto c = Load(kLlama32_1B_Transformers5);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_TRUE(c->tie_word_embeddings);
}

TEST_F(ModelConfigTest, Transformers5DefaultRopeParameters) {
  json j = MinimalLlama();
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
}

TEST_F(ModelConfigTest, LegacyLinearRopeScalingWithTypeKey) {
  json j = MinimalLlama();
  j["rope_theta"] = 1e6;
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4}};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 4.0);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
}

TEST_F(ModelConfigTest, DefaultsWhenKeysAbsent) {
  auto c = Parse(MinimalLlama());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_EQ(c->torch_dtype, "");
}

TEST_F(ModelConfigTest, NullHeadDimAndKvHeadsMeanDerived) {
  json j = MinimalLlama();
  j["head_dim"] = nullptr;
  j["num_key_value_heads"] = nullptr;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->num_key_value_heads, 8);
}

TEST_F(ModelConfigTest, ExplicitHeadDimAllowsIndivisibleHiddenSize) {
  json j = MinimalLlama();
  j["hidden_size"] = 5120;
  j["num_attention_heads"] = 32;
  j["head_dim"] = 128;  // like Mistral Nemo: 32 * 128 != 5120
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->head_dim, 128);
}

TEST_F(ModelConfigTest, MistralDefaults) {
  json j = MinimalLlama();
  j["model_type"] = "mistral";
  j["num_attention_heads"] = 16;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->num_key_value_heads, 8);  // MistralConfig's default, not num_attention_heads
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->max_position_embeddings, 4096 * 32);
}

TEST_F(ModelConfigTest, MistralNullSlidingWindowMeansFullAttention) {
  json j = json::parse(kMistral7B);
  j["sliding_window"] = nullptr;  // Mistral 7B v0.2 and later
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->sliding_window, std::nullopt);
}

TEST_F(ModelConfigTest, MistralIgnoresAttentionBias) {
  json j = json::parse(kMistral7B);
  j["attention_bias"] = true;  // transformers builds Mistral without biases regardless
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
}

TEST_F(ModelConfigTest, LlamaAttentionAndMlpBias) {
  json j = MinimalLlama();
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->o_bias);
  EXPECT_TRUE(c->mlp_bias);
}

TEST_F(ModelConfigTest, Qwen2DefaultKvHeadsIs32) {
  json j = MinimalLlama();
  j["model_type"] = "qwen2";
  j["num_attention_heads"] = 32;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->num_key_value_heads, 32);
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_TRUE(c->qkv_bias);
}

TEST_F(ModelConfigTest, Qwen2SlidingWindowFromMaxWindowLayers) {
  json j = json::parse(kQwen2_05B);
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  j["max_window_layers"] = 20;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->sliding_window_first_layer, 20);
}

TEST_F(ModelConfigTest, Qwen2SlidingWindowFromLayerTypes) {
  json j = json::parse(kQwen2_05B);
  j["use_sliding_window"] = true;
  j["layer_types"] = json::array();
  for (int i = 0; i < 24; ++i)
    j["layer_types"].push_back(i < 18 ? "full_attention" : "sliding_attention");
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->sliding_window, 131072);
  EXPECT_EQ(c->sliding_window_first_layer, 18);
}

TEST_F(ModelConfigTest, Qwen2InterleavedLayerTypesUnsupported) {
  json j = json::parse(kQwen2_05B);
  j["use_sliding_window"] = true;
  j["layer_types"] = json::array();
  for (int i = 0; i < 24; ++i)
    j["layer_types"].push_back(i % 2 ? "full_attention" : "sliding_attention");
  ExpectErrorContains(Parse(j).status(), {"/m/config.json", "\"layer_types\"", "not supported"});
}

TEST_F(ModelConfigTest, TorchDtypeKeyOfTransformers4) {
  auto c = Load(kMistral7B);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->torch_dtype, "bfloat16");
}

// ---- errors ----------------------------------------------------------------

TEST_F(ModelConfigTest, MissingModelFolder) {
  const std::string missing = dir_.path() + "/nope";
  ExpectErrorContains(LoadModelConfig(missing).status(), {missing, "does not exist"});
}

TEST_F(ModelConfigTest, MissingConfigJson) {
  ExpectErrorContains(LoadModelConfig(dir_.path()).status(), {ConfigPath(), "no config.json"});
}

TEST_F(ModelConfigTest, ModelPathIsAFile) {
  const std::string file = WriteConfig("{}") + "/config.json";
  ExpectErrorContains(LoadModelConfig(file).status(), {file, "not a folder"});
}

TEST_F(ModelConfigTest, InvalidJsonReportsPosition) {
  ExpectErrorContains(Load("{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 20 48\n}").status(),
                      {ConfigPath(), "invalid JSON near line 3, column 22 (byte offset 48)"});
}

TEST_F(ModelConfigTest, NotAnObject) {
  ExpectErrorContains(Load("[1, 2]").status(), {ConfigPath(), "expected an object"});
}

TEST_F(ModelConfigTest, MissingModelType) {
  json j = MinimalLlama();
  j.erase("model_type");
  ExpectErrorContains(Parse(j).status(),
                      {"/m/config.json", "\"model_type\"", "llama, mistral, qwen2"});
}

TEST_F(ModelConfigTest, UnsupportedModelType) {
  json j = MinimalLlama();
  j["model_type"] = "gemma";
  ExpectErrorContains(Parse(j).status(), {"/m/config.json", "\"model_type\"", "gemma",
                                          "supported: llama, mistral, qwen2"});
}

TEST_F(ModelConfigTest, UnsupportedRopeType) {
  json j = MinimalLlama();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  ExpectErrorContains(Parse(j).status(), {"/m/config.json", "\"rope_scaling.rope_type\"", "yarn",
                                          "supported: default, linear, llama3"});
}

TEST_F(ModelConfigTest, UnsupportedRopeTypeInRopeParameters) {
  json j = MinimalLlama();
  j["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 2.0}, {"rope_theta", 10000.0}};
  ExpectErrorContains(Parse(j).status(), {"\"rope_parameters.rope_type\"", "dynamic",
                                          "supported: default, linear, llama3"});
}

TEST_F(ModelConfigTest, Llama3RopeMissingParameter) {
  json j = json::parse(kLlama32_1B);
  j["rope_scaling"].erase("original_max_position_embeddings");
  ExpectErrorContains(
      Parse(j).status(),
      {"/m/config.json", "\"rope_scaling.original_max_position_embeddings\"", "missing"});
}

TEST_F(ModelConfigTest, Llama3RopeHighFreqNotAboveLow) {
  json j = json::parse(kLlama32_1B);
  j["rope_scaling"]["high_freq_factor"] = 1.0;
  ExpectErrorContains(Parse(j).status(), {"\"rope_scaling.high_freq_factor\"",
                                          "greater than low_freq_factor (1.0), got 1.0"});
}

TEST_F(ModelConfigTest, LinearRopeMissingFactor) {
  json j = MinimalLlama();
  j["rope_scaling"] = {{"rope_type", "linear"}};
  ExpectErrorContains(Parse(j).status(), {"\"rope_scaling.factor\"", "missing"});
}

TEST_F(ModelConfigTest, PerLayerTypeRopeParametersUnsupported) {
  json j = MinimalLlama();
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  ExpectErrorContains(Parse(j).status(), {"rope_parameters.", "per layer type"});
}

TEST_F(ModelConfigTest, MissingRequiredKey) {
  json j = MinimalLlama();
  j.erase("intermediate_size");
  ExpectErrorContains(Parse(j).status(),
                      {"/m/config.json", "missing required key \"intermediate_size\""});
}

TEST_F(ModelConfigTest, WrongTypeForSize) {
  json j = MinimalLlama();
  j["hidden_size"] = "2048";
  ExpectErrorContains(Parse(j).status(),
                      {"/m/config.json", "\"hidden_size\"", "positive integer", "string"});
}

TEST_F(ModelConfigTest, FloatSizeIsWrongType) {
  json j = MinimalLlama();
  j["vocab_size"] = 1000.0;
  ExpectErrorContains(Parse(j).status(), {"\"vocab_size\"", "positive integer"});
}

TEST_F(ModelConfigTest, WrongTypeForBool) {
  json j = MinimalLlama();
  j["tie_word_embeddings"] = "yes";
  ExpectErrorContains(Parse(j).status(), {"\"tie_word_embeddings\"", "true or false"});
}

TEST_F(ModelConfigTest, WrongTypeForRopeTheta) {
  json j = MinimalLlama();
  j["rope_theta"] = "1e6";
  ExpectErrorContains(Parse(j).status(), {"\"rope_theta\"", "positive number"});
}

TEST_F(ModelConfigTest, NonPositiveSize) {
  json j = MinimalLlama();
  j["num_hidden_layers"] = 0;
  ExpectErrorContains(Parse(j).status(),
                      {"/m/config.json", "\"num_hidden_layers\"", "must be > 0"});
  j = MinimalLlama();
  j["intermediate_size"] = -5;
  ExpectErrorContains(Parse(j).status(), {"\"intermediate_size\"", "must be > 0, got -5"});
}

TEST_F(ModelConfigTest, NonPositiveRmsNormEps) {
  json j = MinimalLlama();
  j["rms_norm_eps"] = 0.0;
  ExpectErrorContains(Parse(j).status(), {"\"rms_norm_eps\"", "must be > 0"});
}

TEST_F(ModelConfigTest, HeadsNotMultipleOfKvHeads) {
  json j = MinimalLlama();
  j["num_key_value_heads"] = 3;
  ExpectErrorContains(Parse(j).status(), {"/m/config.json", "\"num_key_value_heads\"",
                                          "3 does not divide num_attention_heads (8)"});
}

TEST_F(ModelConfigTest, HiddenSizeNotDivisibleByHeadsWithoutHeadDim) {
  json j = MinimalLlama();
  j["hidden_size"] = 250;
  ExpectErrorContains(Parse(j).status(),
                      {"/m/config.json", "\"hidden_size\"",
                       "not divisible by num_attention_heads (8)", "no head_dim"});
}

TEST_F(ModelConfigTest, NonPositiveSlidingWindow) {
  json j = json::parse(kMistral7B);
  j["sliding_window"] = 0;
  ExpectErrorContains(Parse(j).status(), {"\"sliding_window\"", "must be > 0"});
}

}  // namespace
}  // namespace trainerd::engine
