// A llama of random weights at sizes where the Hopper kernels of our own
// take its products (HopperSizedModel), and what the tests that switch one
// of them on compare: the loss and every adapter gradient on two rows of
// 2048 tokens, with and without. Shared by epilogue_gemm_test and
// hopper_attention_test.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/batch.h"
#include "engine/llama_model.h"
#include "engine/lora.h"
#include "engine/model_config.h"
#include "tests/engine/test_support.h"

namespace trainerd::testing {

// The shape of a llama of random weights (HopperSizedModel).
struct ModelShape {
  int64_t hidden, f, heads, kv_heads, d;
};

// A llama of random weights, 2 layers, at sizes where the GEMM of our own
// takes its products on an H100 or H200: by default the fixture's config with
// hidden 512, MLP 2048, 8 heads of 64 (2 kv heads) (the MLPs'); LoRA r 16 on
// every projection, B random so that every adapter's gradient path counts.
inline std::unique_ptr<engine::LlamaModel> HopperSizedModel(const ModelShape& shape = {512, 2048, 8, 2, 64}) {
  auto base = engine::LoadModelConfig(Fixture("llama/model"));
  EXPECT_TRUE(base.ok());
  nlohmann::json j = base->raw;
  const int64_t hidden = shape.hidden, f = shape.f, heads = shape.heads, kv_heads = shape.kv_heads, d = shape.d;
  const int64_t layers = 2;
  j["hidden_size"] = hidden;
  j["intermediate_size"] = f;
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] = kv_heads;
  j["head_dim"] = d;
  j["num_hidden_layers"] = layers;
  j["max_position_embeddings"] = 4096;
  auto config = engine::ParseModelConfig(j, "the fixture's config at hidden " + std::to_string(hidden));
  EXPECT_TRUE(config.ok());
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  torch::manual_seed(23);
  auto normal = [&](int64_t rows, int64_t cols) { return torch::randn({rows, cols}, opts) * 0.02; };
  const int64_t vocab = config->vocab_size;
  std::map<std::string, torch::Tensor> w;
  w["model.embed_tokens.weight"] = normal(vocab, hidden);
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    w[p + "input_layernorm.weight"] = torch::ones({hidden}, opts);
    w[p + "post_attention_layernorm.weight"] = torch::ones({hidden}, opts);
    w[p + "self_attn.q_proj.weight"] = normal(heads * d, hidden);
    w[p + "self_attn.k_proj.weight"] = normal(kv_heads * d, hidden);
    w[p + "self_attn.v_proj.weight"] = normal(kv_heads * d, hidden);
    w[p + "self_attn.o_proj.weight"] = normal(hidden, heads * d);
    w[p + "mlp.gate_proj.weight"] = normal(f, hidden);
    w[p + "mlp.up_proj.weight"] = normal(f, hidden);
    w[p + "mlp.down_proj.weight"] = normal(hidden, f);
  }
  w["model.norm.weight"] = torch::ones({hidden}, opts);
  w["lm_head.weight"] = normal(vocab, hidden);
  auto model = engine::LlamaModel::FromWeights(*config, std::move(w), "random weights");
  EXPECT_TRUE(model.ok()) << model.status().message();
  engine::LoraSettings lora;
  lora.r = 16;
  lora.alpha = 32;
  lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  engine::AttachLora(**model, lora);
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : engine::LoraNamedParameters(**model)) {
    if (name.find("lora_B") != std::string::npos) t.normal_(0, 0.02);
  }
  return std::move(*model);
}

// Two rows of 2048 random tokens (storage keeps the examples).
inline engine::Batch TwoRows(const engine::LlamaModel& model, std::vector<engine::TokenExample>& storage) {
  storage.assign(2, {});
  torch::manual_seed(29);
  for (engine::TokenExample& ex : storage) {
    const torch::Tensor ids = torch::randint(0, model.config().vocab_size, {2048}, torch::kInt64);
    ex.input_ids.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 2048);
    ex.labels = ex.input_ids;
  }
  return engine::MakeBatch({&storage[0], &storage[1]}, model.device());
}

// The model's loss on the batch and every adapter's gradient.
struct Trained {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads;
};
inline Trained LossAndGradients(const engine::LlamaModel& model, const engine::Batch& batch) {
  for (const auto& [_, t] : engine::LoraNamedParameters(model)) t.mutable_grad() = torch::Tensor();
  Trained r;
  r.loss = engine::CausalLmLossSum(model, batch);
  r.loss.backward();
  for (const auto& [_, t] : engine::LoraNamedParameters(model)) r.grads.push_back(t.grad().detach().clone());
  r.loss = r.loss.detach();
  return r;
}

// `with` against `without`: the loss within the loss tolerance, every adapter
// gradient within ten times it; reported under `what`.
inline void ExpectTrainsAs(const Trained& with, const Trained& without, const std::string& what) {
  EXPECT_LE(Report(what + ": the loss", RelativeError(with.loss, without.loss)),
            TestTolerances().loss);
  ASSERT_EQ(with.grads.size(), without.grads.size());
  double worst = 0;
  for (size_t i = 0; i < without.grads.size(); ++i) {
    const double e = RelativeError(with.grads[i], without.grads[i]);
    worst = std::max(worst, e);
    EXPECT_LE(e, TestTolerances().loss * 10) << "adapter tensor " << i;
  }
  Report(what + ": the worst adapter gradient", worst);
}

}  // namespace trainerd::testing
