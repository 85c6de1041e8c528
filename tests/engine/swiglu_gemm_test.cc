// engine/swiglu_gemm.h: SwiGLU in the MLP's GEMMs. Forward: the gate|up
// group's GEMM makes h = silu(gate) * up in rows with the down group's spare
// columns, FusedSwiGlu given it returns it as its node's output, and the
// outputs, loss and gradients are SwiGLU's own pass's. Backward: down's
// input-gradient GEMM gives SwiGLU's gradients. The GEMM of our own takes
// exactly the products it should: bf16 on a Hopper GPU, shapes that fill the
// SMs, the setting on; none in float32, none on the CPU, none switched off.
// A model whose MLPs the GEMM takes trains the same at every level (on the
// GPU). (The model with SwiGLU's backward in down's node, on any device:
// speed_paths_test's SwiGluInDown.)
// Its results against cuBLAS and the SwiGLU kernel are the point on the GPU
// (TRAINERD_TEST_DEVICE=cuda TRAINERD_TEST_DTYPE=bfloat16 on an H100/H200); on
// the CPU (CI) the fall-back's plumbing is what runs.
#include "engine/swiglu_gemm.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#ifdef TRAINERD_WITH_HOPPER_GEMM
#include <c10/cuda/CUDAGuard.h>

#include "engine/kernels/hopper_gemm.h"
#endif

#include "engine/batch.h"
#include "engine/fused_ops.h"
#include "engine/linear.h"
#include "engine/linear_group.h"
#include "engine/llama_model.h"
#include "engine/lora.h"
#include "engine/model_config.h"
#include "tests/engine/test_support.h"
#include "tests/engine/wide_rows.h"

namespace trainerd {
namespace {

using testing::RelativeError;
using testing::TorchTestDevice;
using testing::TorchTestDtype;

// Whether the GEMM of our own should take an (m x k) (k x n) product in this
// run: bf16 on a CUDA device, in a build that has the kernel, of a shape it
// suits on this GPU (kernels::HopperGemmSuits: a Hopper one, a tile for each
// of its SMs).
bool Expected(int64_t m, int64_t n, int64_t k) {
#ifdef TRAINERD_WITH_HOPPER_GEMM
  if (TorchTestDtype() != torch::kBFloat16 || !TorchTestDevice().is_cuda()) return false;
  const c10::cuda::CUDAGuard guard(TorchTestDevice());
  return kernels::HopperGemmSuits(m, n, k);
#else
  (void)m, (void)n, (void)k;
  return false;
#endif
}

// The tolerance of bf16 results against SwiGLU's own pass (the product's
// summation order alone; outputs rounded to 8 bits of mantissa).
double Tolerance() { return TorchTestDtype() == torch::kBFloat16 ? 2e-2 : 2e-6; }

// gate and up layers of width f on an input of `in`, each with a rank-8 LoRA
// (float32 parameters that want gradients), widened into one group.
struct GateUp {
  std::vector<engine::Linear> layers;
  engine::LinearGroup group;
  std::vector<const engine::Linear*> members;

  GateUp(int64_t in, int64_t f) : layers(2) {
    const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
    const char* names[2] = {"gate", "up"};
    for (int i = 0; i < 2; ++i) {
      layers[i].name = names[i];
      layers[i].weight = torch::randn({f, in}, opts) * 0.03;
      engine::LoraWeights lora;
      lora.a = (torch::randn({8, in}, f32) * 0.03).set_requires_grad(true);
      lora.b = (torch::randn({f, 8}, f32) * 0.03).set_requires_grad(true);
      lora.scaling = 2.0;
      layers[i].lora = lora;
    }
    engine::Widen(group, {&layers[0], &layers[1]});
    members = {&layers[0], &layers[1]};
  }

  // h for input p with the setting `on`, then the gradients of a loss
  // weighing h's columns differently: {h, dp, dA_gate, dB_gate, dA_up,
  // dB_up}. *made: whether the GEMM made h.
  std::vector<torch::Tensor> Run(const torch::Tensor& p, int64_t spare, bool on, bool* made) {
    engine::SetSwiGluGemm(on ? 1 : 0);
    for (auto& l : layers) {
      l.lora->a.mutable_grad() = torch::Tensor();
      l.lora->b.mutable_grad() = torch::Tensor();
    }
    // The input as the norm before gate|up leaves it: rows with the group's spare columns.
    const torch::Tensor leaf = p.clone().requires_grad_(true);
    const torch::Tensor x = testing::WideRowsFunction::apply(leaf, group.cols);
    engine::SwiGluOutput swiglu{spare, {}};
    const std::vector<torch::Tensor> gate_up = engine::ForwardGroup(group, members, x, {}, {}, &swiglu);
    *made = swiglu.h.defined();
    if (*made) {
      EXPECT_EQ(swiglu.h.stride(0), gate_up[0].size(-1) + spare) << "h's rows leave the down group's columns";
      EXPECT_EQ(swiglu.h.size(1), gate_up[0].size(-1));
    }
    const torch::Tensor h = engine::FusedSwiGlu(gate_up[0], gate_up[1], spare, swiglu.h);
    if (*made) {
      EXPECT_EQ(h.data_ptr(), swiglu.h.data_ptr()) << "the node returns the GEMM's output";
    }
    const torch::Tensor weights =
        torch::randn({1, h.size(-1)}, torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice()));
    (h.to(torch::kFloat32) * weights).sum().backward();
    std::vector<torch::Tensor> results{h.detach().clone(), leaf.grad().clone()};
    for (const auto& l : layers) {
      results.push_back(l.lora->a.grad().clone());
      results.push_back(l.lora->b.grad().clone());
    }
    engine::SetSwiGluGemm(0);
    return results;
  }
};

// With the GEMM and without it (SwiGLU's own pass): the same h, input gradient
// and LoRA gradients; the GEMM ran where it should, and only there.
TEST(SwiGluGemm, SameAsSwiGlusOwnPass) {
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  struct Shape {
    int64_t tokens, in, f, spare;
  };
  // Tails in every dimension of the product (m not a multiple of 128, gate's
  // width not of 128, k = in + the LoRA columns not of 64), then none.
  for (const Shape& s : {Shape{4200, 1000, 2056, 8}, Shape{4224, 1024, 2048, 16}}) {
    torch::manual_seed(13);
    GateUp gate_up(s.in, s.f);
    const torch::Tensor p = torch::randn({s.tokens, s.in}, opts);
    bool made_with = false, made_without = false;
    const engine::SwiGluGemmCounts before = engine::SwiGluGemmRuns();
    torch::manual_seed(17);
    const std::vector<torch::Tensor> with = gate_up.Run(p, s.spare, /*on=*/true, &made_with);
    const engine::SwiGluGemmCounts after = engine::SwiGluGemmRuns();
    torch::manual_seed(17);
    const std::vector<torch::Tensor> without = gate_up.Run(p, s.spare, /*on=*/false, &made_without);
    const bool expected = Expected(s.tokens, 2 * s.f, gate_up.group.widened.size(1));
    EXPECT_EQ(made_with, expected) << s.tokens << " x " << 2 * s.f;
    EXPECT_EQ(after.forward - before.forward, expected ? 1 : 0);
    EXPECT_EQ(after.backward, before.backward);
    EXPECT_FALSE(made_without) << "switched off, SwiGLU is its own pass";
    testing::Report("SwiGLU made by gate|up's GEMM (" + std::to_string(s.tokens) + " tokens)", made_with ? 1 : 0);
    ASSERT_EQ(with.size(), without.size());
    for (size_t i = 0; i < with.size(); ++i) {
      EXPECT_LE(RelativeError(with[i], without[i]), Tolerance()) << s.tokens << " tokens, result " << i;
    }
  }
}

// What it declines even when switched on: products too small to fill the SMs
// (one layer of a tiny model), float32 and the CPU (Expected says which),
// and h rows whose spare columns break TMA's 16-byte rows.
TEST(SwiGluGemm, DeclinesWhatItShould) {
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  engine::SetSwiGluGemm(1);
  const int64_t runs_before = engine::SwiGluGemmRuns().forward;
  torch::Tensor h;
  const torch::Tensor small_x = torch::randn({256, 512}, opts), small_w = torch::randn({1024, 512}, opts);
  EXPECT_FALSE(engine::GateUpWithSwiGlu(small_x, small_w, 8, &h).defined());
  EXPECT_FALSE(h.defined());
  const torch::Tensor x = torch::randn({4224, 1024}, opts), w = torch::randn({4096, 1024}, opts) * 0.03;
  EXPECT_FALSE(engine::GateUpWithSwiGlu(x, w, 4, &h).defined()) << "spare columns not a multiple of 8";
  EXPECT_EQ(engine::SwiGluGemmRuns().forward, runs_before);
  const torch::Tensor gate_up = engine::GateUpWithSwiGlu(x, w, 8, &h);
  EXPECT_EQ(gate_up.defined(), Expected(4224, 4096, 1024));
  EXPECT_EQ(engine::SwiGluGemmRuns().forward - runs_before, Expected(4224, 4096, 1024) ? 1 : 0);
  if (gate_up.defined()) {
    // Against cuBLAS and the SwiGLU pass directly.
    const torch::Tensor reference = torch::mm(x, w.t());
    EXPECT_LE(RelativeError(gate_up, reference), 1e-2);
    EXPECT_LE(RelativeError(h, engine::PlainSwiGlu(reference.narrow(1, 0, 2048), reference.narrow(1, 2048, 2048))),
              2e-2);
  }
  engine::SetSwiGluGemm(0);
  torch::Tensor h_off;
  EXPECT_FALSE(engine::GateUpWithSwiGlu(x, w, 8, &h_off).defined()) << "switched off";
  EXPECT_FALSE(h_off.defined());
}

// SwiGLU's backward in down's input-gradient GEMM: [dgate | dup] against
// cuBLAS's dh and SwiGluGradients, from operands laid out as down's node has
// them ([g | u | 0] in rows wider than its columns, [W ; A ; 0]'s left
// columns, gate and up the halves of one buffer); taken exactly where it
// should be, and declined for gate and up that are not one buffer's halves.
TEST(SwiGluGemm, DownInputGradientMatchesCublasAndTheKernel) {
  torch::manual_seed(19);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const int64_t tokens = 4200, out = 1024, rank = 16, f = 2056;
  const int64_t k = out + rank;
  const torch::Tensor x = torch::randn({tokens, k + 8}, opts).narrow(1, 0, k);
  const torch::Tensor w = (torch::randn({k + 16, f + 24}, opts) * 0.03).narrow(1, 0, f).narrow(0, 0, k);
  const torch::Tensor gate_up = torch::randn({tokens, 2 * f}, opts) * 2;
  const torch::Tensor gate = gate_up.narrow(1, 0, f), up = gate_up.narrow(1, f, f);
  engine::SetSwiGluGemm(1);
  const torch::Tensor at_level_1 = engine::DownInputGradientWithSwiGlu(x, w, gate, up);
  engine::SetSwiGluGemm(2);
  const engine::SwiGluGemmCounts before = engine::SwiGluGemmRuns();
  const torch::Tensor grads = engine::DownInputGradientWithSwiGlu(x, w, gate, up);
  const torch::Tensor apart = engine::DownInputGradientWithSwiGlu(x, w, gate.contiguous(), up.contiguous());
  engine::SetSwiGluGemm(0);
  EXPECT_FALSE(at_level_1.defined()) << "level 1 is the forward only";
  const bool expected = Expected(tokens, f, k);
  EXPECT_EQ(grads.defined(), expected);
  EXPECT_FALSE(apart.defined()) << "gate and up in buffers of their own";
  const engine::SwiGluGemmCounts after = engine::SwiGluGemmRuns();
  EXPECT_EQ(after.backward - before.backward, expected ? 1 : 0);
  EXPECT_EQ(after.forward, before.forward);
  testing::Report("SwiGLU's backward made by down's GEMM", grads.defined() ? 1 : 0);
  if (grads.defined()) {
    const auto [dgate, dup] = engine::SwiGluGradients(torch::mm(x, w), gate, up);
    EXPECT_LE(RelativeError(grads.narrow(1, 0, f), dgate), 1e-2);
    EXPECT_LE(RelativeError(grads.narrow(1, f, f), dup), 1e-2);
  }
}

// A llama of random weights at sizes where the GEMM of our own takes its
// MLPs' products on an H100 or H200: the fixture's config with hidden 512,
// MLP 2048, 8 heads of 64 (2 kv heads), 2 layers; LoRA r 16 on every
// projection, B random so that every adapter's gradient path counts.
std::unique_ptr<engine::LlamaModel> HopperSizedModel() {
  auto base = engine::LoadModelConfig(testing::Fixture("llama/model"));
  EXPECT_TRUE(base.ok());
  nlohmann::json j = base->raw;
  const int64_t hidden = 512, f = 2048, heads = 8, kv_heads = 2, d = 64, layers = 2;
  j["hidden_size"] = hidden;
  j["intermediate_size"] = f;
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] = kv_heads;
  j["head_dim"] = d;
  j["num_hidden_layers"] = layers;
  j["max_position_embeddings"] = 4096;
  auto config = engine::ParseModelConfig(j, "the fixture's config at hidden 512");
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

// The model above at levels 0, 1 and 2 on two rows of 2048 tokens: at 1 and
// 2 the GEMM takes each layer's gate|up product (and at 2 down's input
// gradient) exactly once, and the loss and every adapter gradient are level
// 0's within bf16's tolerances. Only where the GEMM takes these products
// (bf16 on a Hopper GPU): elsewhere nothing here would run it.
TEST(SwiGluGemm, ModelTrainsAsWithoutItAtEveryLevel) {
  const int64_t tokens = 2 * 2048;
  if (!Expected(tokens, 2 * 2048, 512) || !Expected(tokens, 2048, 512)) {
    GTEST_SKIP() << "the GEMM takes no product here (it needs bf16 on a Hopper GPU)";
  }
  auto model = HopperSizedModel();
  model->set_training(true);
  std::vector<engine::TokenExample> storage(2);
  torch::manual_seed(29);
  for (engine::TokenExample& ex : storage) {
    const torch::Tensor ids = torch::randint(0, model->config().vocab_size, {2048}, torch::kInt64);
    ex.input_ids.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 2048);
    ex.labels = ex.input_ids;
  }
  const engine::Batch batch = engine::MakeBatch({&storage[0], &storage[1]}, model->device());
  struct Result {
    torch::Tensor loss;
    std::vector<torch::Tensor> grads;
    int64_t forward = 0, backward = 0;
  };
  auto run = [&](int level) {
    engine::SetSwiGluGemm(level);
    for (const auto& [_, t] : engine::LoraNamedParameters(*model)) t.mutable_grad() = torch::Tensor();
    const engine::SwiGluGemmCounts before = engine::SwiGluGemmRuns();
    Result r;
    r.loss = engine::CausalLmLossSum(*model, batch);
    r.loss.backward();
    const engine::SwiGluGemmCounts after = engine::SwiGluGemmRuns();
    engine::SetSwiGluGemm(0);
    r.forward = after.forward - before.forward;
    r.backward = after.backward - before.backward;
    for (const auto& [_, t] : engine::LoraNamedParameters(*model)) r.grads.push_back(t.grad().detach().clone());
    r.loss = r.loss.detach();
    return r;
  };
  const Result plain = run(0);
  EXPECT_EQ(plain.forward + plain.backward, 0);
  for (int level : {1, 2}) {
    SCOPED_TRACE("level " + std::to_string(level));
    const Result fused = run(level);
    EXPECT_EQ(fused.forward, 2) << "gate|up of each layer";
    EXPECT_EQ(fused.backward, level == 2 ? 2 : 0) << "down's input gradient of each layer";
    EXPECT_LE(testing::Report("level " + std::to_string(level) + ": the loss against level 0's",
                              RelativeError(fused.loss, plain.loss)),
              testing::TestTolerances().loss);
    ASSERT_EQ(fused.grads.size(), plain.grads.size());
    double worst = 0;
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      const double e = RelativeError(fused.grads[i], plain.grads[i]);
      worst = std::max(worst, e);
      EXPECT_LE(e, testing::TestTolerances().loss * 10) << "adapter tensor " << i;
    }
    testing::Report("level " + std::to_string(level) + ": the worst adapter gradient against level 0's", worst);
  }
}

}  // namespace
}  // namespace trainerd
