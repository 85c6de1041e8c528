// Packing: a packed batch computes exactly the losses of its examples
// unpacked (issue bound: 1e-5 relative, fp32 CPU). On CUDA in bf16 packed
// attention is variable-length flash attention, and unpacked rows run cuDNN's
// kernel (TRAINERD_TEST_DEVICE=cuda runs those tests; elsewhere they skip,
// saying why).
#include <torch/version.h>

#include "engine/batch.h"
#include "engine/cudnn_attention.h"
#include "engine/llama_model.h"
#include "engine/lora.h"
#include "engine/model_config.h"
#include "engine/packing.h"
#include "engine/tensor_io.h"
#include "tests/engine/test_support.h"

namespace trainerd::testing {
namespace {

std::unique_ptr<engine::LlamaModel> Model(const std::string& name) {
  auto config = engine::LoadModelConfig(Fixture(name + "/model"));
  EXPECT_TRUE(config.ok());
  auto weights = engine::LoadModelWeights(Fixture(name + "/model"), TorchTestDtype(), TorchTestDevice());
  EXPECT_TRUE(weights.ok());
  auto model = engine::LlamaModel::FromWeights(*config, std::move(*weights), name);
  EXPECT_TRUE(model.ok());
  return std::move(*model);
}

TEST(PackExamples, FillsSequencesInOrderAndRestartsPositions) {
  engine::TokenDataset data;
  data.examples = {{{1, 2, 3}, {1, 2, 3}, {}}, {{4, 5}, {-100, 5}, {}}, {{6, 7, 8, 9}, {6, 7, 8, 9}, {}}};
  data.lines = 3;
  engine::TokenDataset packed = engine::PackExamples(data, 6);
  ASSERT_EQ(packed.examples.size(), 2u);
  EXPECT_EQ(packed.examples[0].input_ids, (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(packed.examples[0].labels, (std::vector<int64_t>{-100, 2, 3, -100, 5}));
  EXPECT_EQ(packed.examples[0].position_ids, (std::vector<int64_t>{0, 1, 2, 0, 1}));
  EXPECT_EQ(packed.examples[1].position_ids, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(packed.examples[0].target_tokens(), data.examples[0].target_tokens() + data.examples[1].target_tokens());
  EXPECT_EQ(packed.lines, 3);
}

class PackingLossTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PackingLossTest, PackedLossEqualsUnpackedLosses) {
  auto model = Model(GetParam());
  auto data = engine::LoadTokenDataset(Fixture("llama/lora_train/train.jsonl"), model->config().vocab_size, 64);
  ASSERT_TRUE(data.ok()) << data.status().message();
  torch::NoGradGuard no_grad;
  double unpacked = 0;
  int64_t unpacked_targets = 0;
  for (const auto& ex : data->examples) {
    engine::Batch b = engine::MakeBatch({&ex}, model->device());
    unpacked += engine::CausalLmLossSum(*model, b).item<double>();
    unpacked_targets += b.target_tokens;
  }
  engine::TokenDataset packed = engine::PackExamples(*data, 48);
  ASSERT_LT(packed.examples.size(), data->examples.size());  // something was packed
  std::vector<const engine::TokenExample*> rows;
  for (const auto& ex : packed.examples) rows.push_back(&ex);
  engine::Batch b = engine::MakeBatch(rows, model->device());  // padded too: rows differ in length
  ASSERT_TRUE(b.position_ids.defined());
  const double packed_loss = engine::CausalLmLossSum(*model, b).item<double>();
  EXPECT_EQ(b.target_tokens, unpacked_targets);
  EXPECT_LE(Report(GetParam() + " packed vs unpacked loss rel err", std::abs(packed_loss - unpacked) / unpacked),
            TestDtype() == "bfloat16" ? 1e-2 : 1e-5);
}

TEST(PackedRun, TrainsAndReportsThePacking) {
  TempDir tmp;
  RecordingReporter r;
  auto result = engine::RunJob(
      SpecFromYaml("model: {path: " + Fixture("llama/model") + ", dtype: float32}\nadapter: {r: 2}\n"
                   "data: {train: " + Fixture("llama/lora_train/train.jsonl") + ", eval: " + Fixture("llama/eval.jsonl") +
                   ", packing: true, max_seq_len: 48}\ntraining: {max_steps: 3, micro_batch_size: 2}\n"
                   "output: {dir: " + (tmp / "out") + "}\ndevice: cpu\n",
                   tmp.path()),
      {}, r);
  ASSERT_TRUE(result.ok()) << result.status().message();
  // Other notes (e.g. the tokenized cache's) may come first.
  std::string notes;
  for (const std::string& m : r.messages) notes += m + "\n";
  EXPECT_NE(notes.find("packed into"), std::string::npos) << notes;
  EXPECT_LT(r.info.train_examples, 10);  // 10 examples became fewer sequences
  // Eval over packed sequences still counts every target token of data.eval once.
  ASSERT_FALSE(r.evals.empty());
  EXPECT_EQ(r.evals.back().eval_tokens, 27);
}

INSTANTIATE_TEST_SUITE_P(Families, PackingLossTest, ::testing::Values("llama", "mistral", "qwen2"));

std::vector<int32_t> CuSeqlens(const engine::PackedSegments& s) {
  torch::Tensor cu = s.cu_seqlens.to(torch::kCPU);
  EXPECT_EQ(cu.scalar_type(), torch::kInt32);
  return std::vector<int32_t>(cu.data_ptr<int32_t>(), cu.data_ptr<int32_t>() + cu.numel());
}

TEST(PackedSegments, SplitsRowsAtExamplesAndTrailingPadding) {
  // Row 0: examples of 3 and 2 tokens, then 3 of padding; row 1: one example
  // of 6, then 2 of padding; row 2: positions not starting at 0 still start a
  // segment at the row's start (segments never cross rows).
  torch::Tensor positions = torch::tensor({0, 1, 2, 0, 1, 0, 1, 2,  //
                                           0, 1, 2, 3, 4, 5, 0, 1,  //
                                           3, 4, 5, 6, 0, 1, 2, 3},
                                          torch::kInt64)
                                .view({3, 8});
  engine::PackedSegments s = engine::PackedSegmentsFromPositions(positions, torch::kCPU);
  EXPECT_EQ(CuSeqlens(s), (std::vector<int32_t>{0, 3, 5, 8, 14, 16, 20, 24}));
  EXPECT_EQ(s.max_len, 6);
  EXPECT_TRUE(s.cu_seqlens.device().is_cpu());
}

TEST(PackedSegments, AgreeWithTheDenseMaskOfAPackedBatch) {
  engine::TokenDataset data;
  data.examples = {{{1, 2, 3}, {1, 2, 3}, {}}, {{4, 5}, {-100, 5}, {}}, {{6, 7, 8, 9}, {6, 7, 8, 9}, {}},
                   {{1, 2}, {1, 2}, {}},       {{3, 4, 5, 6, 7, 8, 9}, {3, 4, 5, 6, 7, 8, 9}, {}}};
  engine::TokenDataset packed = engine::PackExamples(data, 7);  // rows of 5, 6 and 7 tokens
  ASSERT_EQ(packed.examples.size(), 3u);
  std::vector<const engine::TokenExample*> rows;
  for (const auto& ex : packed.examples) rows.push_back(&ex);
  engine::Batch b = engine::MakeBatch(rows, torch::kCPU);
  ASSERT_TRUE(b.position_ids.defined());
  EXPECT_FALSE(b.segments.defined());  // the CPU path keeps its dense mask and needs none
  engine::PackedSegments s = engine::PackedSegmentsFromPositions(b.position_ids, torch::kCPU);
  // [1 2 3][4 5] pad2 | [6 7 8 9][1 2] pad1 | [3 .. 9]
  EXPECT_EQ(CuSeqlens(s), (std::vector<int32_t>{0, 3, 5, 7, 11, 13, 14, 21}));
  EXPECT_EQ(s.max_len, 7);
  // Same segment and causal <=> the dense mask allows it.
  const std::vector<int32_t> cu = CuSeqlens(s);
  const int64_t t = b.input_ids.size(1);
  std::vector<int64_t> segment(static_cast<size_t>(b.input_ids.numel()));
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    for (int32_t j = cu[i]; j < cu[i + 1]; ++j) segment[static_cast<size_t>(j)] = static_cast<int64_t>(i);
  }
  torch::Tensor mask = engine::PackedAttentionMask(b.position_ids);
  auto m = mask.accessor<bool, 4>();
  for (int64_t r = 0; r < b.input_ids.size(0); ++r) {
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t j = 0; j < t; ++j) {
        const bool allowed = j <= i && segment[static_cast<size_t>(r * t + i)] == segment[static_cast<size_t>(r * t + j)];
        EXPECT_EQ(m[r][0][i][j], allowed) << "row " << r << " query " << i << " key " << j;
      }
    }
  }
}

TEST(VarlenAttention, OnlyOnCudaInHalfPrecision) {
  EXPECT_FALSE(engine::UsesVarlenAttention(torch::kCPU, torch::kBFloat16, 64));
  EXPECT_FALSE(engine::UsesVarlenAttention(torch::kCPU, torch::kFloat32, 64));
  // Decided before any CUDA call: no fp32 flash kernel, head_dim flash's backward refuses.
  EXPECT_FALSE(engine::UsesVarlenAttention(torch::Device("cuda:0"), torch::kFloat32, 64));
  EXPECT_FALSE(engine::UsesVarlenAttention(torch::Device("cuda:0"), torch::kBFloat16, 12));
  EXPECT_FALSE(engine::UsesVarlenAttention(torch::Device("cuda:0"), torch::kFloat16, 512));
}

// Skips unless the suite runs on CUDA with a LibTorch that has varlen flash attention.
#define SKIP_UNLESS_CUDA_VARLEN()                                                                              \
  do {                                                                                                         \
    if (TestDevice() != "cuda") GTEST_SKIP() << "variable-length attention is CUDA-only: set TRAINERD_TEST_DEVICE=cuda"; \
    if (TORCH_VERSION_MAJOR < 2) GTEST_SKIP() << "LibTorch " TORCH_VERSION " has no variable-length attention"; \
  } while (0)

// The kernel against the explicit dense-mask path in float32, outputs and
// q/k/v gradients, with grouped heads and rows ending in padding.
TEST(VarlenAttention, MatchesTheDenseMaskInBfloat16) {
  SKIP_UNLESS_CUDA_VARLEN();
  const torch::Device dev = TorchTestDevice();
  ASSERT_TRUE(engine::UsesVarlenAttention(dev, torch::kBFloat16, 16));
  torch::manual_seed(3);
  const int64_t b = 2, t = 13, nh = 4, nkv = 2, d = 16;
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
  torch::Tensor q0 = torch::randn({b, nh, t, d}, f32), k0 = torch::randn({b, nkv, t, d}, f32);
  torch::Tensor v0 = torch::randn({b, nkv, t, d}, f32), w = torch::randn({b, nh, t, d}, f32);
  // Row 0: examples of 5 and 6, 2 of padding; row 1: 4, 3, 4, 2 of padding.
  torch::Tensor positions = torch::tensor({0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 0, 1,  //
                                           0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 0, 1},
                                          torch::kInt64)
                                .view({b, t});
  engine::PackedSegments s = engine::PackedSegmentsFromPositions(positions, dev);
  ASSERT_EQ(s.max_len, 6);

  // Reference: float32, explicit softmax with the dense mask.
  torch::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
  torch::Tensor v = v0.clone().requires_grad_(true);
  torch::Tensor ref = engine::CausalAttentionExplicit(q, k, v, engine::PackedAttentionMask(positions.to(dev)));
  (ref * w).sum().backward();

  // Varlen: bfloat16, (B*T, heads, d).
  auto flat = [&](const torch::Tensor& x) { return x.transpose(1, 2).reshape({b * t, x.size(1), d}); };
  torch::Tensor qb = q0.to(torch::kBFloat16).requires_grad_(true), kb = k0.to(torch::kBFloat16).requires_grad_(true);
  torch::Tensor vb = v0.to(torch::kBFloat16).requires_grad_(true);
  torch::Tensor out = engine::VarlenCausalAttention(flat(qb), flat(kb), flat(vb), s);  // (B*T, nh, d)
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{b * t, nh, d}));
  out = out.view({b, t, nh, d}).transpose(1, 2);
  (out.to(torch::kFloat32) * w).sum().backward();

  EXPECT_LE(Report("varlen vs dense-mask attention rel err (bf16)", RelativeError(out, ref)), 2e-2);
  EXPECT_LE(Report("varlen dq rel err (bf16)", RelativeError(qb.grad(), q.grad())), 3e-2);
  EXPECT_LE(Report("varlen dk rel err (bf16)", RelativeError(kb.grad(), k.grad())), 3e-2);
  EXPECT_LE(Report("varlen dv rel err (bf16)", RelativeError(vb.grad(), v.grad())), 3e-2);
}

TEST(CudnnAttention, NotOnCpuOrInFloat32) {
  EXPECT_EQ(engine::CudnnAttentionModeFor(torch::kCPU, torch::kBFloat16, 4, 2, 64),
            engine::CudnnAttentionMode::kUnavailable);
  // Decided before any CUDA call: the fallback (flash) has no fp32 kernel.
  EXPECT_EQ(engine::CudnnAttentionModeFor(torch::Device("cuda:0"), torch::kFloat32, 4, 2, 64),
            engine::CudnnAttentionMode::kUnavailable);
}

// cuDNN's kernel by rows, in the layout the model passes (transposed views of
// (B, T, heads, d)), against the explicit causal softmax in float32: output
// and q/k/v gradients, grouped heads. The unpacked model path (parity tests,
// the unpacked side of VarlenPackingTest) runs through it on CUDA.
TEST(CudnnAttention, MatchesTheExplicitCausalAttentionInBfloat16) {
  SKIP_UNLESS_CUDA_VARLEN();
  const torch::Device dev = TorchTestDevice();
  const int64_t b = 2, t = 40, nh = 8, nkv = 2, d = 64;
  const engine::CudnnAttentionMode mode = engine::CudnnAttentionModeFor(dev, torch::kBFloat16, nh, nkv, d);
  std::printf("[  figure  ] cuDNN attention mode: %s\n",
              mode == engine::CudnnAttentionMode::kNative     ? "native grouped heads"
              : mode == engine::CudnnAttentionMode::kRepeated ? "repeated kv heads"
                                                              : "unavailable");
  ASSERT_NE(mode, engine::CudnnAttentionMode::kUnavailable)
      << "cuDNN attention should run with LibTorch " TORCH_VERSION " on this GPU";
  torch::manual_seed(4);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
  torch::Tensor q0 = torch::randn({b, t, nh, d}, f32), k0 = torch::randn({b, t, nkv, d}, f32);
  torch::Tensor v0 = torch::randn({b, t, nkv, d}, f32), w = torch::randn({b, nh, t, d}, f32);

  torch::Tensor q = q0.transpose(1, 2).contiguous().requires_grad_(true);
  torch::Tensor k = k0.transpose(1, 2).contiguous().requires_grad_(true);
  torch::Tensor v = v0.transpose(1, 2).contiguous().requires_grad_(true);
  torch::Tensor ref = engine::CausalAttentionExplicit(q, k, v);  // (B, nh, T, d)
  (ref * w).sum().backward();

  torch::Tensor qb = q0.to(torch::kBFloat16).requires_grad_(true), kb = k0.to(torch::kBFloat16).requires_grad_(true);
  torch::Tensor vb = v0.to(torch::kBFloat16).requires_grad_(true);
  torch::Tensor out = engine::CudnnCausalAttention(qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2), mode);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{b, nh, t, d}));
  (out.to(torch::kFloat32) * w).sum().backward();

  EXPECT_LE(Report("cuDNN vs explicit attention rel err (bf16)", RelativeError(out, ref)), 2e-2);
  EXPECT_LE(Report("cuDNN dq rel err (bf16)", RelativeError(qb.grad().transpose(1, 2), q.grad())), 3e-2);
  EXPECT_LE(Report("cuDNN dk rel err (bf16)", RelativeError(kb.grad().transpose(1, 2), k.grad())), 3e-2);
  EXPECT_LE(Report("cuDNN dv rel err (bf16)", RelativeError(vb.grad().transpose(1, 2), v.grad())), 3e-2);
}

// Identity whose backward hands on the gradient as the left part of wider
// rows, as a widened o group gives its input gradient (a column view of one
// product, engine/linear_group.h).
class GradientInWiderRows : public torch::autograd::Function<GradientInWiderRows> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) { return x.view_as(x); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor g = grads[0].reshape({-1, grads[0].size(-1)});
    const torch::Tensor rows = torch::full({g.size(0), g.size(1) + 16}, 7.0, g.options());
    rows.narrow(1, 0, g.size(1)).copy_(g);
    return {rows.narrow(1, 0, g.size(1)).view(grads[0].sizes())};
  }
};

// The q/k/v gradients are right whatever the layout of the output gradient,
// dense or rows of a wider product, in either order, with the same q/k/v
// shapes and strides each time: PyTorch caches cuDNN's backward graph by
// those, not by the output gradient's strides.
TEST(CudnnAttention, GradientsRightWhateverTheOutputGradientsLayout) {
  SKIP_UNLESS_CUDA_VARLEN();
  const torch::Device dev = TorchTestDevice();
  const int64_t b = 2, t = 48, nh = 4, nkv = 2, d = 16;  // a layout no other test here runs
  const engine::CudnnAttentionMode mode = engine::CudnnAttentionModeFor(dev, torch::kBFloat16, nh, nkv, d);
  ASSERT_NE(mode, engine::CudnnAttentionMode::kUnavailable);
  torch::manual_seed(9);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
  torch::Tensor q0 = torch::randn({b, t, nh, d}, f32), k0 = torch::randn({b, t, nkv, d}, f32);
  torch::Tensor v0 = torch::randn({b, t, nkv, d}, f32), w = torch::randn({b, t, nh * d}, f32);

  torch::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
  torch::Tensor v = v0.clone().requires_grad_(true);
  torch::Tensor ref = engine::CausalAttentionExplicit(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));
  (ref.transpose(1, 2).reshape({b, t, nh * d}) * w).sum().backward();

  for (bool wide : {true, false, true}) {
    SCOPED_TRACE(wide ? "output gradient in wider rows" : "dense output gradient");
    torch::Tensor qb = q0.to(torch::kBFloat16).requires_grad_(true);
    torch::Tensor kb = k0.to(torch::kBFloat16).requires_grad_(true);
    torch::Tensor vb = v0.to(torch::kBFloat16).requires_grad_(true);
    torch::Tensor out = engine::CudnnCausalAttention(qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2), mode);
    torch::Tensor o = out.transpose(1, 2).reshape({b, t, nh * d});
    if (wide) o = GradientInWiderRows::apply(o);
    (o.to(torch::kFloat32) * w).sum().backward();
    EXPECT_LE(RelativeError(qb.grad(), q.grad()), 3e-2);
    EXPECT_LE(RelativeError(kb.grad(), k.grad()), 3e-2);
    EXPECT_LE(RelativeError(vb.grad(), v.grad()), 3e-2);
  }
}

// A packed batch's loss and gradients (LoRA A/B and base attention weights)
// equal those of its examples run one by one, in bfloat16 on CUDA, and the
// packed batch took the variable-length path.
class VarlenPackingTest : public ::testing::TestWithParam<std::string> {};

TEST_P(VarlenPackingTest, PackedLossAndGradientsEqualUnpackedInBfloat16) {
  SKIP_UNLESS_CUDA_VARLEN();
  const std::string name = GetParam();
  auto config = engine::LoadModelConfig(Fixture(name + "/model"));
  ASSERT_TRUE(config.ok());
  auto weights = engine::LoadModelWeights(Fixture(name + "/model"), torch::kBFloat16, TorchTestDevice());
  ASSERT_TRUE(weights.ok());
  auto loaded = engine::LlamaModel::FromWeights(*config, std::move(*weights), name);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  engine::LlamaModel& model = **loaded;
  ASSERT_TRUE(model.UsesVarlenAttention()) << name << ": bf16 on CUDA should take the variable-length path";

  torch::manual_seed(5);
  engine::LoraSettings lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  engine::AttachLora(model, lora);
  std::vector<std::pair<std::string, torch::Tensor>> params = engine::LoraNamedParameters(model);
  {
    // B = 0 at init would leave every A gradient zero.
    torch::NoGradGuard no_grad;
    for (auto& [pname, p] : params) {
      if (pname.find("lora_B") != std::string::npos) p.normal_(0.0, 0.05);
    }
  }
  engine::DecoderLayer& layer0 = model.layers()[0];
  for (engine::Linear* l : {&layer0.q_proj, &layer0.k_proj, &layer0.v_proj, &layer0.o_proj}) {
    l->weight.requires_grad_(true);
    params.emplace_back(l->name + ".weight", l->weight);
  }
  auto grads = [&] {
    std::vector<torch::Tensor> out;
    for (auto& [pname, p] : params) {
      out.push_back(p.grad().defined() ? p.grad().detach().to(torch::kFloat32).clone() : torch::Tensor());
      if (p.grad().defined()) p.mutable_grad().reset();
    }
    return out;
  };

  auto data = engine::LoadTokenDataset(Fixture("llama/lora_train/train.jsonl"), model.config().vocab_size, 64);
  ASSERT_TRUE(data.ok()) << data.status().message();
  double unpacked = 0;
  for (const auto& ex : data->examples) {
    engine::Batch b = engine::MakeBatch({&ex}, model.device());
    torch::Tensor loss = engine::CausalLmLossSum(model, b);
    loss.backward();
    unpacked += loss.item<double>();
  }
  std::vector<torch::Tensor> unpacked_grads = grads();

  engine::TokenDataset packed = engine::PackExamples(*data, 48);
  ASSERT_LT(packed.examples.size(), data->examples.size());
  std::vector<const engine::TokenExample*> rows;
  for (const auto& ex : packed.examples) rows.push_back(&ex);
  engine::Batch b = engine::MakeBatch(rows, model.device());  // rows differ in length: trailing padding
  ASSERT_TRUE(b.segments.defined());
  EXPECT_GT(CuSeqlens(b.segments).size(), packed.examples.size() + 1);  // several examples per row
  torch::Tensor loss = engine::CausalLmLossSum(model, b);
  loss.backward();
  const double packed_loss = loss.item<double>();
  std::vector<torch::Tensor> packed_grads = grads();

  EXPECT_LE(Report(name + " varlen packed vs unpacked loss rel err (bf16)", std::abs(packed_loss - unpacked) / unpacked),
            1e-2);
  double worst = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(unpacked_grads[i].defined() && packed_grads[i].defined()) << params[i].first;
    ASSERT_GT(unpacked_grads[i].abs().max().item<double>(), 0.0) << params[i].first;
    const double err = RelativeError(packed_grads[i], unpacked_grads[i]);
    worst = std::max(worst, err);
    EXPECT_LE(err, 5e-2) << params[i].first;
  }
  Report(name + " varlen packed vs unpacked worst gradient rel err (bf16)", worst);
}

INSTANTIATE_TEST_SUITE_P(Families, VarlenPackingTest, ::testing::Values("llama", "mistral", "qwen2"));

}  // namespace
}  // namespace trainerd::testing
