// engine/epilogue_gemm.h. SwiGLU in the MLP's GEMMs. Forward: the gate|up
// group's GEMM makes h = silu(gate) * up in rows with the down group's spare
// columns, FusedSwiGlu given it returns it as its node's output, and the
// outputs, loss and gradients are SwiGLU's own pass's. Backward: down's
// input-gradient GEMM gives SwiGLU's gradients. The GEMM of our own takes
// exactly the products it should: bf16 on a Hopper GPU, shapes that fill the
// SMs, the setting on; none in float32, none on the CPU, none switched off.
// A model whose MLPs the GEMM takes trains the same at every level (on the
// GPU), and with down's LoRA product made by gate|up's GEMM as well (that
// product against float32's too). (The model with SwiGLU's backward in
// down's node, on any device: speed_paths_test's SwiGluInDown.)
// The rotary embedding in q|k|v's GEMM: the product against cuBLAS's and the
// rotation; q|k|v's node, asked to rotate, gives FusedQkvRope's outputs and
// gradients (on any device: the rotation in place over the product where
// the GEMM of our own does not take it); a model trains the same with it.
// Its results against cuBLAS and the SwiGLU kernel are the point on the GPU
// (TRAINERD_TEST_DEVICE=cuda TRAINERD_TEST_DTYPE=bfloat16 on an H100/H200); on
// the CPU (CI) the fall-back's plumbing is what runs.
#include "engine/epilogue_gemm.h"

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#ifdef TRAINERD_WITH_HOPPER_KERNELS
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
#include "tests/engine/hopper_sized_model.h"
#include "tests/engine/test_support.h"
#include "tests/engine/wide_rows.h"

namespace trainerd {
namespace {

using testing::ExpectTrainsAs;
using testing::HopperSizedModel;
using testing::LossAndGradients;
using testing::RelativeError;
using testing::TorchTestDevice;
using testing::TorchTestDtype;
using testing::Trained;
using testing::TwoRows;

// Whether the GEMM of our own should take an (m x k) (k x n) product in this
// run: bf16 on a CUDA device, in a build that has the kernel, of a shape it
// suits on this GPU (kernels::HopperGemmSuits: a Hopper one, a tile for each
// of its SMs).
bool Expected(int64_t m, int64_t n, int64_t k) {
#ifdef TRAINERD_WITH_HOPPER_KERNELS
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

// Layers of widths `outs` on an input of `in`, each with a rank-8 LoRA
// (float32 parameters that want gradients), widened into one group.
struct LoraGroup {
  std::vector<engine::Linear> layers;
  engine::LinearGroup group;
  std::vector<const engine::Linear*> members;

  LoraGroup(int64_t in, const std::vector<int64_t>& outs) : layers(outs.size()) {
    const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
    std::vector<engine::Linear*> widened;
    for (size_t i = 0; i < outs.size(); ++i) {
      layers[i].weight = torch::randn({outs[i], in}, opts) * 0.03;
      engine::LoraWeights lora;
      lora.a = (torch::randn({8, in}, f32) * 0.03).set_requires_grad(true);
      lora.b = (torch::randn({outs[i], 8}, f32) * 0.03).set_requires_grad(true);
      lora.scaling = 2.0;
      layers[i].lora = lora;
      widened.push_back(&layers[i]);
    }
    engine::Widen(group, widened);
    members.assign(widened.begin(), widened.end());
  }

  void ClearLoraGradients() {
    for (auto& l : layers) {
      l.lora->a.mutable_grad() = torch::Tensor();
      l.lora->b.mutable_grad() = torch::Tensor();
    }
  }

  // Every layer's dA and dB, in layer order, after `results`.
  void AppendLoraGradients(std::vector<torch::Tensor>& results) const {
    for (const auto& l : layers) {
      results.push_back(l.lora->a.grad().clone());
      results.push_back(l.lora->b.grad().clone());
    }
  }
};

// gate and up layers of width f on an input of `in` (LoraGroup).
struct GateUp : LoraGroup {
  GateUp(int64_t in, int64_t f) : LoraGroup(in, {f, f}) {
    layers[0].name = "gate";
    layers[1].name = "up";
  }

  // h for input p with the setting `on`, then the gradients of a loss
  // weighing h's columns differently: {h, dp, dA_gate, dB_gate, dA_up,
  // dB_up}. *made: whether the GEMM made h.
  std::vector<torch::Tensor> Run(const torch::Tensor& p, int64_t spare, bool on, bool* made) {
    engine::SetSwiGluGemm(on ? 1 : 0);
    ClearLoraGradients();
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
    AppendLoraGradients(results);
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
    const engine::EpilogueGemmCounts before = engine::EpilogueGemmRuns();
    torch::manual_seed(17);
    const std::vector<torch::Tensor> with = gate_up.Run(p, s.spare, /*on=*/true, &made_with);
    const engine::EpilogueGemmCounts after = engine::EpilogueGemmRuns();
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
  const int64_t runs_before = engine::EpilogueGemmRuns().forward;
  torch::Tensor h;
  const torch::Tensor small_x = torch::randn({256, 512}, opts), small_w = torch::randn({1024, 512}, opts);
  EXPECT_FALSE(engine::GateUpWithSwiGlu(small_x, small_w, 8, &h).defined());
  EXPECT_FALSE(h.defined());
  const torch::Tensor x = torch::randn({4224, 1024}, opts), w = torch::randn({4096, 1024}, opts) * 0.03;
  EXPECT_FALSE(engine::GateUpWithSwiGlu(x, w, 4, &h).defined()) << "spare columns not a multiple of 8";
  EXPECT_EQ(engine::EpilogueGemmRuns().forward, runs_before);
  const torch::Tensor gate_up = engine::GateUpWithSwiGlu(x, w, 8, &h);
  EXPECT_EQ(gate_up.defined(), Expected(4224, 4096, 1024));
  EXPECT_EQ(engine::EpilogueGemmRuns().forward - runs_before, Expected(4224, 4096, 1024) ? 1 : 0);
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

// Down's LoRA product in gate|up's GEMM (DownLoraInGateUpEnabled): t = h
// a^T in h's first spare columns against float32's product over the GEMM's
// own h, for ranks 16, 5 (odd: the sums' padded column) and 64 (four blocks
// of 16; a given in rows wider than its columns) over 4200 rows (a tile's
// tail) with gate's width 2056 (not of 128); counted where made; declined
// switched off, at level 1, and for a rank over the spare columns.
TEST(SwiGluGemm, DownLoraProductMatchesFloat32) {
  torch::manual_seed(29);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const int64_t tokens = 4200, in = 1024, f = 2056;
  const torch::Tensor x = torch::randn({tokens, in}, opts);
  const torch::Tensor w = torch::randn({2 * f, in}, opts) * 0.03;
  const bool expected = Expected(tokens, 2 * f, in);
  struct Rank {
    int64_t rank, spare, a_stride;
  };
  engine::SetSwiGluGemm(2);
  engine::SetDownLoraInGateUp(true);
  for (const Rank& r : {Rank{16, 16, f}, Rank{5, 8, f}, Rank{64, 64, f + 8}}) {
    SCOPED_TRACE("rank " + std::to_string(r.rank));
    const torch::Tensor a = (torch::randn({r.rank, r.a_stride}, opts) * 0.1).narrow(1, 0, f);
    torch::Tensor h;
    bool made = !expected;
    const engine::EpilogueGemmCounts before = engine::EpilogueGemmRuns();
    const torch::Tensor gate_up = engine::GateUpWithSwiGlu(x, w, r.spare, &h, a, &made);
    const engine::EpilogueGemmCounts after = engine::EpilogueGemmRuns();
    EXPECT_EQ(gate_up.defined(), expected);
    EXPECT_EQ(made, expected);
    EXPECT_EQ(after.down_lora - before.down_lora, expected ? 1 : 0);
    if (!made) continue;
    ASSERT_EQ(h.stride(0), f + r.spare);
    const torch::Tensor t = h.as_strided({tokens, r.rank}, {h.stride(0), 1}, h.storage_offset() + f);
    const torch::Tensor reference = torch::mm(h.to(torch::kFloat32), a.to(torch::kFloat32).t());
    EXPECT_LE(RelativeError(t, reference), 1e-2);
    EXPECT_LE(RelativeError(t.narrow(0, tokens - 8, 8), reference.narrow(0, tokens - 8, 8)), 1e-2) << "the tail";
  }
  testing::Report("down's LoRA product made by gate|up's GEMM", expected ? 1 : 0);
  const torch::Tensor a = torch::randn({16, f}, opts) * 0.1;
  auto declined = [&](int64_t spare) {
    torch::Tensor h;
    bool made = true;
    engine::GateUpWithSwiGlu(x, w, spare, &h, a, &made);
    return !made;
  };
  EXPECT_TRUE(declined(8)) << "rank 16 over 8 spare columns";
  engine::SetSwiGluGemm(1);
  EXPECT_TRUE(declined(16)) << "level 1";
  engine::SetSwiGluGemm(2);
  engine::SetDownLoraInGateUp(false);
  EXPECT_TRUE(declined(16)) << "switched off";
  engine::SetSwiGluGemm(0);
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
  const engine::EpilogueGemmCounts before = engine::EpilogueGemmRuns();
  const torch::Tensor grads = engine::DownInputGradientWithSwiGlu(x, w, gate, up);
  const torch::Tensor apart = engine::DownInputGradientWithSwiGlu(x, w, gate.contiguous(), up.contiguous());
  engine::SetSwiGluGemm(0);
  EXPECT_FALSE(at_level_1.defined()) << "level 1 is the forward only";
  const bool expected = Expected(tokens, f, k);
  EXPECT_EQ(grads.defined(), expected);
  EXPECT_FALSE(apart.defined()) << "gate and up in buffers of their own";
  const engine::EpilogueGemmCounts after = engine::EpilogueGemmRuns();
  EXPECT_EQ(after.backward - before.backward, expected ? 1 : 0);
  EXPECT_EQ(after.forward, before.forward);
  testing::Report("SwiGLU's backward made by down's GEMM", grads.defined() ? 1 : 0);
  if (grads.defined()) {
    const auto [dgate, dup] = engine::SwiGluGradients(torch::mm(x, w), gate, up);
    EXPECT_LE(RelativeError(grads.narrow(1, 0, f), dgate), 1e-2);
    EXPECT_LE(RelativeError(grads.narrow(1, f, f), dup), 1e-2);
  }
}

// Level 3: LoRA's products over the rows in the same GEMM's epilogue, against
// float32 products of the GEMM's own dgate and dup and of h = silu(gate) *
// up: gate|up's t with ranks 16 and 8 in rows wider than its columns (into
// a buffer of the caller's), down's u of rank 12 (a block of 16 part empty),
// over 4200 rows (a tile's tail); each sum alone too; level 2 takes none.
TEST(SwiGluGemm, LoraSumsMatchFloat32Products) {
  torch::manual_seed(23);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  const int64_t tokens = 4200, out = 1024, f = 2056, k = out + 16;
  const torch::Tensor x = torch::randn({tokens, k}, opts);
  const torch::Tensor w = torch::randn({k, f}, opts) * 0.03;
  const torch::Tensor gate_up = torch::randn({tokens, 2 * f}, opts) * 2;
  const torch::Tensor gate = gate_up.narrow(1, 0, f), up = gate_up.narrow(1, f, f);
  const torch::Tensor t = torch::randn({tokens, 24 + 8}, opts).narrow(1, 0, 24);
  const torch::Tensor u = torch::randn({tokens, 12}, opts);
  auto asked = [&](bool b, bool a) {
    engine::SwiGluBackwardLora lora;
    if (b) {
      lora.gate_up_t = t;
      lora.rank_gate = 16;
      lora.rank_up = 8;
      lora.b_sums = torch::full({24, f}, 7.0, f32);  // written over, not added to
    }
    if (a) lora.down_u = u;
    return lora;
  };
  engine::SetSwiGluGemm(2);
  engine::SwiGluBackwardLora at_level_2 = asked(true, true);
  const torch::Tensor level_2 = engine::DownInputGradientWithSwiGlu(x, w, gate, up, &at_level_2);
  EXPECT_FALSE(at_level_2.done) << "level 2 takes no LoRA sums";
  engine::SetSwiGluGemm(3);
  for (auto [b, a] : {std::pair<bool, bool>{true, true}, {true, false}, {false, true}}) {
    SCOPED_TRACE(std::string(b ? "B sums" : "") + (a ? " A sums" : ""));
    engine::SwiGluBackwardLora lora = asked(b, a);
    const torch::Tensor grads = engine::DownInputGradientWithSwiGlu(x, w, gate, up, &lora);
    const bool expected = Expected(tokens, f, k);
    EXPECT_EQ(grads.defined(), expected);
    EXPECT_EQ(lora.done, expected);
    if (!lora.done) continue;
    const torch::Tensor dgate = grads.narrow(1, 0, f).to(torch::kFloat32);
    const torch::Tensor dup = grads.narrow(1, f, f).to(torch::kFloat32);
    if (b) {
      const torch::Tensor tf = t.to(torch::kFloat32);
      EXPECT_LE(RelativeError(lora.b_sums.narrow(0, 0, 16), torch::mm(tf.narrow(1, 0, 16).t(), dgate)), 1e-4);
      EXPECT_LE(RelativeError(lora.b_sums.narrow(0, 16, 8), torch::mm(tf.narrow(1, 16, 8).t(), dup)), 1e-4);
    }
    if (a) {
      // h rounded once, as the GEMM rounds it (PlainSwiGlu rounds SiLU first).
      const torch::Tensor h =
          (torch::silu(gate.to(torch::kFloat32)) * up.to(torch::kFloat32)).to(gate.scalar_type()).to(torch::kFloat32);
      ASSERT_TRUE(lora.a_sums.defined());
      EXPECT_LE(RelativeError(lora.a_sums, torch::mm(u.to(torch::kFloat32).t(), h)), 1e-3);
    }
    if (b && a) testing::Report("LoRA's sums made by down's GEMM", 1);
  }
  engine::SetSwiGluGemm(0);
  EXPECT_EQ(level_2.defined(), Expected(tokens, f, k));
}

// The model above at levels 0 to 3 on two rows of 2048 tokens: from 1 on
// the GEMM takes each layer's gate|up product (and from 2 down's input
// gradient, at 3 with LoRA's sums in it) exactly once, and the loss and every
// adapter gradient are level 0's within bf16's tolerances. Only where the GEMM takes these products
// (bf16 on a Hopper GPU): elsewhere nothing here would run it.
TEST(SwiGluGemm, ModelTrainsAsWithoutItAtEveryLevel) {
  const int64_t tokens = 2 * 2048;
  if (!Expected(tokens, 2 * 2048, 512) || !Expected(tokens, 2048, 512)) {
    GTEST_SKIP() << "the GEMM takes no product here (it needs bf16 on a Hopper GPU)";
  }
  auto model = HopperSizedModel();
  model->set_training(true);
  std::vector<engine::TokenExample> storage;
  const engine::Batch batch = TwoRows(*model, storage);
  struct Result {
    Trained trained;
    int64_t forward = 0, backward = 0, down_lora = 0;
  };
  auto run = [&](int level, bool down_lora) {
    engine::SetSwiGluGemm(level);
    engine::SetDownLoraInGateUp(down_lora);
    const engine::EpilogueGemmCounts before = engine::EpilogueGemmRuns();
    Result r{LossAndGradients(*model, batch)};
    const engine::EpilogueGemmCounts after = engine::EpilogueGemmRuns();
    engine::SetSwiGluGemm(0);
    engine::SetDownLoraInGateUp(false);
    r.forward = after.forward - before.forward;
    r.backward = after.backward - before.backward;
    r.down_lora = after.down_lora - before.down_lora;
    return r;
  };
  const Result plain = run(0, false);
  EXPECT_EQ(plain.forward + plain.backward + plain.down_lora, 0);
  // Levels 1-3, then level 2 with down's LoRA product in gate|up's GEMM too.
  for (auto [level, down_lora] : {std::pair<int, bool>{1, false}, {2, false}, {3, false}, {2, true}}) {
    const std::string what = "level " + std::to_string(level) + (down_lora ? " with down's LoRA product" : "");
    SCOPED_TRACE(what);
    const Result fused = run(level, down_lora);
    EXPECT_EQ(fused.forward, 2) << "gate|up of each layer";
    EXPECT_EQ(fused.backward, level >= 2 ? 2 : 0) << "down's input gradient of each layer";
    EXPECT_EQ(fused.down_lora, down_lora ? 2 : 0) << "down's LoRA product in gate|up's GEMM";
    ExpectTrainsAs(fused.trained, plain.trained, what + " against level 0");
  }
}

// ---- the rotary embedding in q|k|v's GEMM ----

// Llama 3's frequencies for heads of d (theta 500,000), float32 on the test device.
torch::Tensor InvFreq(int64_t d) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  return 1.0 / torch::pow(500000.0, torch::arange(0, d, 2, f32) / static_cast<double>(d));
}

// Two packed sequences' positions over `tokens` rows, the second from 3000 on
// (angles in the thousands, as long sequences have them).
torch::Tensor TwoSequencePositions(int64_t tokens) {
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(TorchTestDevice());
  const int64_t first = tokens / 2;
  return torch::cat({torch::arange(first, i64), torch::arange(3000, 3000 + tokens - first, i64)});
}

// The product against cuBLAS's with the rotation after it (FusedRope's, on
// the heads of q and k; v's columns the product's), taken exactly where it
// should be; declined switched off, for heads of 64, a rotated region that
// is not whole heads of 128, and a product too small for the SMs.
TEST(RopeGemm, ProductMatchesCublasAndTheRotation) {
  torch::manual_seed(31);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const int64_t tokens = 4200, k = 1024, heads = 8, kv_heads = 1, d = 128;
  const int64_t n = (heads + 2 * kv_heads) * d, rotated = (heads + kv_heads) * d;
  const torch::Tensor x = torch::randn({tokens, k + 8}, opts).narrow(1, 0, k);
  const torch::Tensor w = torch::randn({n, k}, opts) * 0.03;
  const torch::Tensor positions = TwoSequencePositions(tokens), inv_freq = InvFreq(d);
  engine::SetRopeGemm(false);
  EXPECT_FALSE(engine::ProductWithRope(x, w, positions, inv_freq, d, rotated).defined()) << "switched off";
  engine::SetRopeGemm(true);
  const int64_t runs_before = engine::EpilogueGemmRuns().rope;
  EXPECT_FALSE(engine::ProductWithRope(x, w, positions, InvFreq(64), 64, rotated).defined()) << "heads of 64";
  EXPECT_FALSE(engine::ProductWithRope(x, w, positions, inv_freq, d, rotated - 64).defined()) << "half a head";
  EXPECT_FALSE(engine::ProductWithRope(x.narrow(0, 0, 256), w, positions.narrow(0, 0, 256), inv_freq, d, rotated)
                   .defined())
      << "too small to fill the SMs";
  EXPECT_EQ(engine::EpilogueGemmRuns().rope, runs_before);
  const torch::Tensor product = engine::ProductWithRope(x, w, positions, inv_freq, d, rotated);
  engine::SetRopeGemm(false);
  const bool expected = Expected(tokens, n, k);
  EXPECT_EQ(product.defined(), expected);
  EXPECT_EQ(engine::EpilogueGemmRuns().rope - runs_before, expected ? 1 : 0);
  testing::Report("q|k|v's product rotated by its GEMM", product.defined() ? 1 : 0);
  if (product.defined()) {
    const torch::Tensor reference = torch::mm(x, w.t());
    const torch::Tensor qk = reference.narrow(1, 0, rotated).reshape({tokens, heads + kv_heads, d});
    EXPECT_LE(RelativeError(product.narrow(1, 0, rotated).reshape({tokens, heads + kv_heads, d}),
                            engine::FusedRope(qk, positions, inv_freq)),
              Tolerance());
    EXPECT_LE(RelativeError(product.narrow(1, rotated, n - rotated), reference.narrow(1, rotated, n - rotated)),
              Tolerance())
        << "v's columns: the product itself";
  }
}

// q, k and v layers (heads of d; k and v with kv_heads) on an input of `in`
// (LoraGroup).
struct Qkv : LoraGroup {
  int64_t heads, kv_heads, d;

  Qkv(int64_t in, int64_t heads_, int64_t kv_heads_, int64_t d_)
      : LoraGroup(in, {heads_ * d_, kv_heads_ * d_, kv_heads_ * d_}), heads(heads_), kv_heads(kv_heads_), d(d_) {}

  // Attention's q, k and v for input p: rotated by the group's node (in_node,
  // the setting on), or after it by FusedQkvRope; then the gradients of a
  // loss weighing every element differently: {q, k, v, dp, dA_q, dB_q, ...}.
  // wide: p comes in rows with the group's spare columns (the norm's output,
  // the product's GEMM widened in place), else dense (the node's other
  // path). *rotated: whether the node rotated.
  std::vector<torch::Tensor> Run(const torch::Tensor& p, const torch::Tensor& positions, bool in_node, bool wide,
                                 bool* rotated) {
    engine::SetRopeGemm(in_node);
    ClearLoraGradients();
    const torch::Tensor leaf = p.clone().requires_grad_(true);
    const torch::Tensor x = wide ? testing::WideRowsFunction::apply(leaf, group.cols) : leaf;
    const torch::Tensor inv_freq = InvFreq(d);
    engine::QkvRope rope{positions, inv_freq, d, heads + kv_heads};
    const std::vector<torch::Tensor> qkv =
        engine::ForwardGroup(group, members, x, {}, {}, nullptr, nullptr, in_node ? &rope : nullptr);
    *rotated = rope.done;
    const int64_t n = p.size(0);
    std::array<torch::Tensor, 3> heads_of{qkv[0].view({n, heads, d}), qkv[1].view({n, kv_heads, d}),
                                          qkv[2].view({n, kv_heads, d})};
    if (!in_node) heads_of = engine::FusedQkvRope(heads_of[0], heads_of[1], heads_of[2], positions, inv_freq);
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
    torch::manual_seed(37);
    torch::Tensor loss = torch::zeros({}, f32);
    for (const torch::Tensor& t : heads_of) loss = loss + (t.to(torch::kFloat32) * torch::randn(t.sizes(), f32)).sum();
    loss.backward();
    std::vector<torch::Tensor> results;
    for (const torch::Tensor& t : heads_of) results.push_back(t.detach().clone());
    results.push_back(leaf.grad().clone());
    AppendLoraGradients(results);
    engine::SetRopeGemm(false);
    return results;
  }
};

// q|k|v's node asked to rotate gives FusedQkvRope's q, k and v, and the same
// input and adapter gradients, on both of the node's paths (a widened input,
// whose product the GEMM of our own takes where Expected says; a dense one,
// rotated in place after the product); 8 heads and one kv head of 128, so
// that v's columns start inside a tile of the GEMM.
TEST(RopeGemm, QkvNodeRotatesAsFusedQkvRope) {
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const int64_t tokens = 4200, in = 1000;
  torch::manual_seed(41);
  Qkv qkv(in, 8, 1, 128);
  const torch::Tensor p = torch::randn({tokens, in}, opts);
  const torch::Tensor positions = TwoSequencePositions(tokens);
  for (bool wide : {true, false}) {
    SCOPED_TRACE(wide ? "a widened input" : "a dense input");
    bool rotated_on = false, rotated_off = true;
    const int64_t runs_before = engine::EpilogueGemmRuns().rope;
    const std::vector<torch::Tensor> on = qkv.Run(p, positions, /*in_node=*/true, wide, &rotated_on);
    const int64_t runs = engine::EpilogueGemmRuns().rope - runs_before;
    const std::vector<torch::Tensor> off = qkv.Run(p, positions, /*in_node=*/false, wide, &rotated_off);
    EXPECT_TRUE(rotated_on);
    EXPECT_FALSE(rotated_off);
    const bool expected = wide && Expected(tokens, qkv.group.widened.size(0), qkv.group.widened.size(1));
    EXPECT_EQ(runs, expected ? 1 : 0);
    ASSERT_EQ(on.size(), off.size());
    for (size_t i = 0; i < on.size(); ++i) {
      EXPECT_LE(RelativeError(on[i], off[i]), Tolerance()) << "result " << i;
    }
  }
}

// A model with heads of 128 (hidden 1024, 8 heads, one kv head) trains the
// same with the rotary embedding in q|k|v's GEMM: the GEMM takes each layer's
// product once; the loss and adapter gradients as without it. Only where the
// GEMM takes these products (bf16 on a Hopper GPU).
TEST(RopeGemm, ModelTrainsAsWithoutIt) {
  const int64_t tokens = 2 * 2048;
  if (!Expected(tokens, 10 * 128, 1024)) {
    GTEST_SKIP() << "the GEMM takes no product here (it needs bf16 on a Hopper GPU)";
  }
  auto model = HopperSizedModel({1024, 2048, 8, 1, 128});
  model->set_training(true);
  std::vector<engine::TokenExample> storage;
  const engine::Batch batch = TwoRows(*model, storage);
  engine::SetRopeGemm(false);  // on by default for bf16 on CUDA
  const Trained plain = LossAndGradients(*model, batch);
  engine::SetRopeGemm(true);
  const int64_t before = engine::EpilogueGemmRuns().rope;
  const Trained rotated = LossAndGradients(*model, batch);
  const int64_t runs = engine::EpilogueGemmRuns().rope - before;
  engine::SetRopeGemm(false);
  EXPECT_EQ(runs, 2) << "q|k|v of each layer";
  ExpectTrainsAs(rotated, plain, "the rotary embedding in q|k|v's GEMM against FusedQkvRope");
}

}  // namespace
}  // namespace trainerd
