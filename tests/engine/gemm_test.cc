// engine/gemm.h: the decoder's products give torch::mm's results in every
// layout the engine hands them (row views of wider buffers, narrowed weight
// columns, outputs that are row ranges of a larger gradient), and the GEMM of
// our own takes exactly the products it should: on a Hopper GPU the bf16 ones
// of shapes it suits (kernels::HopperGemmSuits), none in float32, none on the
// CPU, none with the setting off.
// Its results against cuBLAS's are the point on the GPU (TRAINERD_TEST_DEVICE
// =cuda TRAINERD_TEST_DTYPE=bfloat16 on an H100/H200); on the CPU (CI) the
// dispatch's fall-back is what runs.
#include "engine/gemm.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/fused_ops.h"
#include "engine/kernels/hopper_gemm.h"
#include "engine/linear.h"
#include "engine/linear_group.h"
#include "tests/engine/test_support.h"
#include "tests/engine/wide_rows.h"

namespace trainerd {
namespace {

using testing::RelativeError;
using testing::TorchTestDevice;
using testing::TorchTestDtype;

// Whether the GEMM of our own should take an (m x k) (k x n) product in this
// run: bf16 on a CUDA device, in a build that has the kernel, of a shape it
// suits on this GPU (a Hopper one; the waves its tiles fill, which depend on
// the SM count).
bool Expected(int64_t m, int64_t n, int64_t k, bool w_transposed) {
#ifdef TRAINERD_WITH_HOPPER_GEMM
  return TorchTestDtype() == torch::kBFloat16 && TorchTestDevice().is_cuda() && kernels::HopperGemmSuits(m, n, k, w_transposed);
#else
  (void)m, (void)n, (void)k, (void)w_transposed;
  return false;
#endif
}

// The tolerance of a bf16 product against cuBLAS's (summation order alone;
// the output is rounded to 8 bits of mantissa), or of the same call.
double Tolerance() { return TorchTestDtype() == torch::kBFloat16 ? 1e-2 : 1e-6; }

// Layers of width outs[i] on an input of `in`, each with a rank-8 LoRA
// (float32 parameters that want gradients), named by `names`.
std::vector<engine::Linear> LoraLayers(int64_t in, const std::vector<int64_t>& outs,
                                       const std::vector<std::string>& names) {
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  std::vector<engine::Linear> layers(outs.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i].name = names[i];
    layers[i].weight = torch::randn({outs[i], in}, opts) * 0.03;
    engine::LoraWeights lora;
    lora.a = (torch::randn({8, in}, f32) * 0.03).set_requires_grad(true);
    lora.b = (torch::randn({outs[i], 8}, f32) * 0.03).set_requires_grad(true);
    lora.scaling = 2.0;
    layers[i].lora = lora;
  }
  return layers;
}

void ClearLoraGradients(std::vector<engine::Linear>& layers) {
  for (auto& l : layers) {
    l.lora->a.mutable_grad() = torch::Tensor();
    l.lora->b.mutable_grad() = torch::Tensor();
  }
}

// Every layer's dA and dB, in order, appended to `results`.
void AppendLoraGradients(const std::vector<engine::Linear>& layers, std::vector<torch::Tensor>& results) {
  for (const auto& l : layers) {
    results.push_back(l.lora->a.grad().clone());
    results.push_back(l.lora->b.grad().clone());
  }
}

TEST(Gemm, MatchesTorchMmInEveryLayout) {
  torch::manual_seed(3);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  engine::SetHopperGemm(true);
  const int64_t runs_before = engine::HopperGemmRuns();
  int expected = 0;  // products the GEMM of our own should have run
  // x W^T: x the left columns of wider rows (a widened input), W the first
  // rows of a taller matrix (a widened matrix's [W | sB] rows); tails in m
  // (not a multiple of 128), n (of 256) and k (of 64), then none.
  for (const auto& shape : std::vector<std::vector<int64_t>>{{4200, 1000, 1000}, {4224, 2048, 1040}}) {
    const int64_t m = shape[0], n = shape[1], k = shape[2];
    const torch::Tensor x = torch::randn({m, k + 24}, opts).narrow(1, 0, k);
    const torch::Tensor w = (torch::randn({n + 40, k}, opts) * 0.05).narrow(0, 0, n);
    const torch::Tensor y = engine::ProductWithTransposed(x, w);
    EXPECT_LE(RelativeError(y, torch::mm(x, w.t())), Tolerance()) << m << " x " << n << " x " << k;
    expected += Expected(m, n, k, false);
  }
  // g W: W's left columns only (a widened matrix's frozen part, rows wider
  // than the product's n), and W whole.
  {
    const torch::Tensor g = torch::randn({4224, 1536}, opts);
    const torch::Tensor w_wide = torch::randn({1536, 1056}, opts) * 0.05;
    const torch::Tensor w_left = w_wide.narrow(1, 0, 1024);
    EXPECT_LE(RelativeError(engine::Product(g, w_left), torch::mm(g, w_left)), Tolerance());
    EXPECT_LE(RelativeError(engine::Product(g, w_wide), torch::mm(g, w_wide)), Tolerance());
    expected += Expected(4224, 1024, 1536, true) + Expected(4224, 1056, 1536, true);
    // Into a row range of a larger gradient (the chunked cross-entropy's).
    torch::Tensor whole = torch::zeros({8448, 1024}, opts);
    torch::Tensor out = whole.narrow(0, 2048, 4224);
    engine::ProductInto(out, g, w_left);
    EXPECT_LE(RelativeError(out, torch::mm(g, w_left)), Tolerance());
    EXPECT_EQ(whole.narrow(0, 0, 2048).abs().max().item<double>(), 0.0) << "rows before the range written";
    EXPECT_EQ(whole.narrow(0, 6272, 2176).abs().max().item<double>(), 0.0) << "rows after the range written";
    expected += Expected(4224, 1024, 1536, true);
  }
  testing::Report("products the GEMM of our own ran", static_cast<double>(engine::HopperGemmRuns() - runs_before));
  EXPECT_EQ(engine::HopperGemmRuns() - runs_before, expected);
  if (Expected(4224, 2048, 1040, false)) {
    EXPECT_GE(expected, 1) << "a Hopper GPU takes some of these shapes";
  }

  // Small products stay with torch::mm, as does every product with the setting off.
  const int64_t runs_small = engine::HopperGemmRuns();
  const torch::Tensor a = torch::randn({512, 256}, opts), b = torch::randn({1024, 256}, opts);
  EXPECT_LE(RelativeError(engine::ProductWithTransposed(a, b), torch::mm(a, b.t())), Tolerance());
  EXPECT_EQ(engine::HopperGemmRuns(), runs_small);
  engine::SetHopperGemm(false);
  const torch::Tensor x = torch::randn({2048, 1024}, opts), w = torch::randn({2048, 1024}, opts);
  EXPECT_TRUE(torch::equal(engine::ProductWithTransposed(x, w), torch::mm(x, w.t())));
  EXPECT_EQ(engine::HopperGemmRuns(), runs_small);
  engine::SetHopperGemm(true);
}

// The widened LoRA groups (engine/linear_group.h) give the same outputs and
// gradients with the GEMM of our own as without it: a q|k|v-like group (its
// input gradient g [W | sB]) and a down-like one (input wider than output:
// [g | u] [W ; A], the LoRA term inside the GEMM), at sizes it takes.
TEST(Gemm, WidenedGroupsSameWithAndWithout) {
  torch::manual_seed(11);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  struct Shape {
    int64_t in;
    std::vector<int64_t> outs;
  };
  const int64_t tokens = 4224;
  for (const Shape& shape : {Shape{1024, {1024, 512, 512}}, Shape{2816, {1024}}}) {
    std::vector<std::string> names;
    for (size_t i = 0; i < shape.outs.size(); ++i) names.push_back("layer" + std::to_string(i));
    std::vector<engine::Linear> layers = LoraLayers(shape.in, shape.outs, names);
    engine::LinearGroup group;
    std::vector<engine::Linear*> to_widen;
    std::vector<const engine::Linear*> members;
    for (auto& l : layers) {
      to_widen.push_back(&l);
      members.push_back(&l);
    }
    engine::Widen(group, to_widen);
    const torch::Tensor p = torch::randn({tokens, shape.in}, opts);
    const torch::Tensor weights = torch::randn({tokens, 1}, f32);
    // Outputs, then the gradients of a loss weighing every output differently.
    auto run = [&](bool on) {
      engine::SetHopperGemm(on);
      ClearLoraGradients(layers);
      // The input as a producer leaves it: rows with the group's spare columns.
      const torch::Tensor leaf = p.clone().requires_grad_(true);
      const torch::Tensor x = testing::WideRowsFunction::apply(leaf, group.cols);
      std::vector<torch::Tensor> ys = engine::ForwardGroup(group, members, x);
      torch::Tensor loss = torch::zeros({}, f32);
      for (size_t i = 0; i < ys.size(); ++i) {
        loss = loss + (ys[i].to(torch::kFloat32) * weights * static_cast<double>(i + 1)).sum();
      }
      loss.backward();
      std::vector<torch::Tensor> results;
      for (const auto& y : ys) results.push_back(y.detach().clone());
      results.push_back(leaf.grad().clone());
      AppendLoraGradients(layers, results);
      return results;
    };
    const int64_t runs_before = engine::HopperGemmRuns();
    const std::vector<torch::Tensor> with = run(true);
    const int64_t runs = engine::HopperGemmRuns() - runs_before;
    const std::vector<torch::Tensor> without = run(false);
    engine::SetHopperGemm(true);
    // The forward's widened product [x | xA^T] [W | sB]^T, and the input
    // gradient's: g [W | sB] where the output is the wider, [g | u] [W ; A]
    // (the A rows below the weights) where the input is.
    int64_t outs = 0;
    for (int64_t out : group.outs) outs += out;
    const int64_t rows = group.widened.size(0), cols = group.widened.size(1);
    const bool wider_input = rows > outs;
    const int expected = Expected(tokens, outs, cols, false) +
                         (wider_input ? Expected(tokens, shape.in, rows, true) : Expected(tokens, cols, outs, true));
    EXPECT_EQ(runs, expected) << "in " << shape.in;
    ASSERT_EQ(with.size(), without.size());
    for (size_t i = 0; i < with.size(); ++i) {
      EXPECT_LE(RelativeError(with[i], without[i]), 2 * Tolerance()) << "in " << shape.in << ", result " << i;
    }
  }
}

// SwiGLU in gate|up's GEMM (the setting's level 2): the group's GEMM makes h
// = silu(gate) * up in rows with the next group's spare columns, and
// FusedSwiGlu given it returns it as its node's output: the same h, loss and
// gradients as SwiGLU's own pass (level 1), on a gate|up-like group.
TEST(Gemm, SwiGluInGateUpsGemm) {
  torch::manual_seed(13);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  const int64_t tokens = 4224, in = 1024, f = 2048, spare = 16;
  std::vector<engine::Linear> layers = LoraLayers(in, {f, f}, {"gate", "up"});
  engine::LinearGroup group;
  engine::Widen(group, {&layers[0], &layers[1]});
  const std::vector<const engine::Linear*> members{&layers[0], &layers[1]};
  const torch::Tensor p = torch::randn({tokens, in}, opts);
  const torch::Tensor weights = torch::randn({1, f}, f32);
  bool made = false;
  auto run = [&](int level) {
    engine::SetHopperGemm(level);
    ClearLoraGradients(layers);
    const torch::Tensor leaf = p.clone().requires_grad_(true);
    const torch::Tensor x = testing::WideRowsFunction::apply(leaf, group.cols);
    engine::SwiGluOutput swiglu{spare, {}};
    const std::vector<torch::Tensor> gate_up = engine::ForwardGroup(group, members, x, {}, {}, &swiglu);
    made = swiglu.h.defined();
    if (made) {
      EXPECT_EQ(swiglu.h.stride(0), f + spare);
      EXPECT_EQ(swiglu.h.size(1), f);
    }
    const torch::Tensor h = engine::FusedSwiGlu(gate_up[0], gate_up[1], spare, swiglu.h);
    if (made) {
      EXPECT_EQ(h.data_ptr(), swiglu.h.data_ptr()) << "the node returns the GEMM's output";
    }
    (h.to(torch::kFloat32) * weights).sum().backward();
    std::vector<torch::Tensor> results{h.detach().clone(), leaf.grad().clone()};
    AppendLoraGradients(layers, results);
    return results;
  };
  const std::vector<torch::Tensor> with = run(2);
  const bool made_with = made;
  const std::vector<torch::Tensor> without = run(1);
  EXPECT_FALSE(made) << "level 1 leaves SwiGLU to its own pass";
  engine::SetHopperGemm(1);
  EXPECT_EQ(made_with, Expected(tokens, 2 * f, in + group.cols, false));
  for (size_t i = 0; i < with.size(); ++i) {
    EXPECT_LE(RelativeError(with[i], without[i]), 2 * Tolerance()) << "result " << i;
  }
}

}  // namespace
}  // namespace trainerd
