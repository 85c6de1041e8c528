// engine/hopper_attention.h: causal attention on the Hopper kernels of our
// own. On a Hopper GPU in bf16 (TRAINERD_TEST_DEVICE=cuda
// TRAINERD_TEST_DTYPE=bfloat16 on an H100/H200): O and the gradients of q, k
// and v against plain LibTorch attention in float32 on the same inputs
// (grouped kv heads, a sequence that ends inside a tile, q|k|v as column views
// of one product as the engine passes them), and a model trains the same with
// it as with cuDNN's; given the rotary embedding's positions, q's and k's
// gradients come back rotated back. Anywhere: what it declines (the setting
// off, the CPU, float32, heads of 64).
#include "engine/hopper_attention.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/llama_model.h"
#include "tests/engine/hopper_sized_model.h"
#include "tests/engine/test_support.h"

namespace trainerd {
namespace {

using testing::RelativeError;
using testing::TorchTestDevice;
using testing::TorchTestDtype;

// Switches the kernels on, or off, for a scope.
struct AttentionOn {
  AttentionOn() { engine::SetHopperAttention(true); }
  ~AttentionOn() { engine::ResetHopperAttention(); }
};
struct AttentionOff {
  AttentionOff() { engine::SetHopperAttention(false); }
  ~AttentionOff() { engine::ResetHopperAttention(); }
};

// A q|k|v product of `rows` tokens (bf16, random, requiring its gradient) and
// its q, k, v as column views.
struct Qkv {
  torch::Tensor product, q, k, v;
};
Qkv MakeQkv(int64_t rows, int64_t heads, int64_t kv_heads, int64_t d, torch::ScalarType dtype,
            const torch::Device& device) {
  Qkv x;
  x.product = torch::randn({rows, (heads + 2 * kv_heads) * d}, torch::TensorOptions().device(device)).to(dtype);
  x.product.requires_grad_(true);
  x.q = x.product.narrow(1, 0, heads * d);
  x.k = x.product.narrow(1, heads * d, kv_heads * d);
  x.v = x.product.narrow(1, (heads + kv_heads) * d, kv_heads * d);
  return x;
}

// Causal attention in float32 by plain LibTorch, grouped heads repeated: O as
// (batch * seq, heads * d).
torch::Tensor PlainAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t batch,
                             int64_t seq, int64_t heads, int64_t kv_heads, int64_t d) {
  auto rows = [&](const torch::Tensor& x, int64_t h) {
    return x.to(torch::kFloat32).reshape({batch, seq, h, d}).transpose(1, 2);
  };
  const torch::Tensor qf = rows(q, heads);
  const torch::Tensor kf = rows(k, kv_heads).repeat_interleave(heads / kv_heads, 1);
  const torch::Tensor vf = rows(v, kv_heads).repeat_interleave(heads / kv_heads, 1);
  torch::Tensor scores = torch::matmul(qf, kf.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
  const torch::Tensor future = torch::ones({seq, seq}, torch::TensorOptions().dtype(torch::kBool).device(q.device()))
                                   .triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, -1), vf).transpose(1, 2).reshape({batch * seq, heads * d});
}

// The rotary embedding's transpose on a gradient (rows, heads * d) in float32:
// g cos - rotate_half(g) sin, cos and sin of positions * inv_freq rounded to
// bf16 as transformers' tables are (what the kernels are to apply).
torch::Tensor RotatedBack(const torch::Tensor& g, const torch::Tensor& positions, const torch::Tensor& inv_freq,
                          int64_t d) {
  const torch::Tensor freqs = positions.to(torch::kFloat32).unsqueeze(1) * inv_freq.unsqueeze(0);  // (rows, d/2)
  const torch::Tensor emb = torch::cat({freqs, freqs}, 1).unsqueeze(1);                            // (rows, 1, d)
  const torch::Tensor cos = emb.cos().to(torch::kBFloat16).to(torch::kFloat32);
  const torch::Tensor sin = emb.sin().to(torch::kBFloat16).to(torch::kFloat32);
  const torch::Tensor x = g.to(torch::kFloat32).reshape({g.size(0), -1, d});
  const torch::Tensor rotated_half = torch::cat({-x.narrow(2, d / 2, d / 2), x.narrow(2, 0, d / 2)}, 2);
  return (x * cos - rotated_half * sin).reshape({g.size(0), -1});
}

bool OnHopperBf16() {
  if (TorchTestDtype() != torch::kBFloat16 || !TorchTestDevice().is_cuda()) return false;
  AttentionOn on;
  const Qkv x = MakeQkv(128, 2, 1, 128, torch::kBFloat16, TorchTestDevice());
  return engine::HopperAttentionTakes(x.q, x.k, x.v, 128);
}

// O, and the product's gradient for a random output gradient, against plain
// attention in float32 on the same bf16 inputs: 2 rows of 300 tokens (the
// last query and key tiles partly past the sequence), 8 query heads sharing
// 2 kv heads; then 1 row of 2048 with 4 heads a kv head (the 8b model's
// grouping). The kernels round P and dS to bf16: about 1e-2 relative.
TEST(HopperAttention, MatchesFloat32AttentionForwardAndBackward) {
  if (!OnHopperBf16()) GTEST_SKIP() << "the kernels need bf16 on a Hopper GPU in a build with them";
  AttentionOn on;
  struct Shape {
    int64_t batch, seq, heads, kv_heads;
  };
  for (const Shape& s : {Shape{2, 300, 8, 2}, Shape{1, 2048, 8, 2}}) {
    torch::manual_seed(41);
    const int64_t d = 128;
    const Qkv x = MakeQkv(s.batch * s.seq, s.heads, s.kv_heads, d, torch::kBFloat16, TorchTestDevice());
    ASSERT_TRUE(engine::HopperAttentionTakes(x.q, x.k, x.v, d));
    const int64_t before = engine::HopperAttentionRuns();
    const torch::Tensor o = engine::HopperCausalAttention(x.q, x.k, x.v, s.batch, s.seq, s.heads, s.kv_heads);
    EXPECT_EQ(engine::HopperAttentionRuns() - before, 1);
    const torch::Tensor grad_o = torch::randn_like(o, torch::kFloat32).to(o.scalar_type());
    const torch::Tensor grad = torch::autograd::grad({o}, {x.product}, {grad_o})[0];

    const torch::Tensor product = x.product.detach().to(torch::kFloat32).requires_grad_(true);
    const torch::Tensor want = PlainAttention(product.narrow(1, 0, s.heads * d),
                                              product.narrow(1, s.heads * d, s.kv_heads * d),
                                              product.narrow(1, (s.heads + s.kv_heads) * d, s.kv_heads * d), s.batch,
                                              s.seq, s.heads, s.kv_heads, d);
    const torch::Tensor want_grad = torch::autograd::grad({want}, {product}, {grad_o.to(torch::kFloat32)})[0];
    const std::string shape = std::to_string(s.batch) + " x " + std::to_string(s.seq);
    EXPECT_LE(testing::Report("O at " + shape, RelativeError(o, want)), 1e-2);
    for (const auto& [name, first, width] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
             {"dq", 0, s.heads * d}, {"dk", s.heads * d, s.kv_heads * d},
             {"dv", (s.heads + s.kv_heads) * d, s.kv_heads * d}}) {
      EXPECT_LE(testing::Report(name + " at " + shape,
                                RelativeError(grad.narrow(1, first, width), want_grad.narrow(1, first, width))),
                2e-2);
    }

    // Given the rotary embedding's positions (each row's from 5 on) and
    // llama3's frequencies: dq and dk rotated back, dv as it was.
    const auto on_device = torch::TensorOptions().device(TorchTestDevice());
    const torch::Tensor positions = (torch::arange(s.seq, on_device.dtype(torch::kInt64)) + 5).repeat({s.batch});
    const torch::Tensor inv_freq =
        torch::pow(500000.0, -torch::arange(0, d, 2, on_device.dtype(torch::kFloat32)) / static_cast<double>(d));
    const torch::Tensor o_rope =
        engine::HopperCausalAttention(x.q, x.k, x.v, s.batch, s.seq, s.heads, s.kv_heads, positions, inv_freq);
    const torch::Tensor grad_rope = torch::autograd::grad({o_rope}, {x.product}, {grad_o})[0];
    EXPECT_TRUE(torch::equal(o_rope, o)) << "the forward does not change";
    const torch::Tensor want_dq = RotatedBack(want_grad.narrow(1, 0, s.heads * d), positions, inv_freq, d);
    const torch::Tensor want_dk =
        RotatedBack(want_grad.narrow(1, s.heads * d, s.kv_heads * d), positions, inv_freq, d);
    EXPECT_LE(testing::Report("dq rotated back at " + shape,
                              RelativeError(grad_rope.narrow(1, 0, s.heads * d), want_dq)),
              2e-2);
    EXPECT_LE(testing::Report("dk rotated back at " + shape,
                              RelativeError(grad_rope.narrow(1, s.heads * d, s.kv_heads * d), want_dk)),
              2e-2);
    EXPECT_TRUE(torch::equal(grad_rope.narrow(1, (s.heads + s.kv_heads) * d, s.kv_heads * d),
                             grad.narrow(1, (s.heads + s.kv_heads) * d, s.kv_heads * d)))
        << "dv is not rotated";
  }
}

// Declined: the setting off, the CPU, float32, heads of 64 (and the kernels
// refuse to run what they were not given).
TEST(HopperAttention, DeclinesWhatItShould) {
  const Qkv cpu = MakeQkv(128, 2, 1, 128, torch::kBFloat16, torch::Device(torch::kCPU));
  {
    AttentionOn on;
    EXPECT_FALSE(engine::HopperAttentionTakes(cpu.q, cpu.k, cpu.v, 128));
  }
  if (!OnHopperBf16()) return;
  const Qkv x = MakeQkv(128, 2, 1, 128, torch::kBFloat16, TorchTestDevice());
  {
    AttentionOff off;
    EXPECT_FALSE(engine::HopperAttentionTakes(x.q, x.k, x.v, 128)) << "the setting is off";
  }
  AttentionOn on;
  const Qkv f32 = MakeQkv(128, 2, 1, 128, torch::kFloat32, TorchTestDevice());
  EXPECT_FALSE(engine::HopperAttentionTakes(f32.q, f32.k, f32.v, 128));
  const Qkv d64 = MakeQkv(128, 4, 2, 64, torch::kBFloat16, TorchTestDevice());
  EXPECT_FALSE(engine::HopperAttentionTakes(d64.q, d64.k, d64.v, 64));
}

// The setting: on unless the environment or SetHopperAttention turns it off;
// ResetHopperAttention goes back to the environment's.
TEST(HopperAttention, OnByDefault) {
  engine::ResetHopperAttention();
  if (std::getenv("TRAINERD_HOPPER_ATTENTION") == nullptr) {
    EXPECT_TRUE(engine::HopperAttentionIsAutomatic());
    EXPECT_TRUE(engine::HopperAttentionEnabled());
  }
  {
    AttentionOff off;
    EXPECT_FALSE(engine::HopperAttentionEnabled());
    EXPECT_FALSE(engine::HopperAttentionIsAutomatic());
    EXPECT_FALSE(engine::HopperAttentionFits(TorchTestDevice(), torch::kBFloat16, 128));
  }
  {
    AttentionOn on;
    EXPECT_TRUE(engine::HopperAttentionEnabled());
    EXPECT_FALSE(engine::HopperAttentionIsAutomatic());
  }
  EXPECT_EQ(engine::HopperAttentionIsAutomatic(), std::getenv("TRAINERD_HOPPER_ATTENTION") == nullptr);
}

// A model with heads of 128 (hidden 1024, 8 heads, one kv head) trains the
// same with attention on the kernels as on cuDNN's: each layer's attention
// runs on them once; the loss and adapter gradients as without. Again with
// every layer recomputed in the backward (activation checkpointing: the
// forward runs twice, the rotation's gradient still taken once).
TEST(HopperAttention, ModelTrainsAsWithoutIt) {
  if (!OnHopperBf16()) GTEST_SKIP() << "the kernels need bf16 on a Hopper GPU in a build with them";
  auto model = testing::HopperSizedModel({1024, 2048, 8, 1, 128});
  model->set_training(true);
  std::vector<engine::TokenExample> storage;
  const engine::Batch batch = testing::TwoRows(*model, storage);
  for (const bool checkpointing : {false, true}) {
    model->set_gradient_checkpointing(checkpointing);
    testing::Trained plain;
    {
      AttentionOff off;
      plain = testing::LossAndGradients(*model, batch);
    }
    testing::Trained ours;
    int64_t runs = 0;
    {
      AttentionOn on;
      const int64_t before = engine::HopperAttentionRuns();
      ours = testing::LossAndGradients(*model, batch);
      runs = engine::HopperAttentionRuns() - before;
    }
    EXPECT_EQ(runs, checkpointing ? 4 : 2) << "each layer's attention, again in the recomputation";
    testing::ExpectTrainsAs(ours, plain,
                            std::string("attention on the Hopper kernels against cuDNN's") +
                                (checkpointing ? ", every layer recomputed" : ""));
  }
  model->set_gradient_checkpointing(false);
}

}  // namespace
}  // namespace trainerd
