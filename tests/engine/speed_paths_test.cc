// The training loop's faster paths compute what the plain ones do: the
// projections that share an input as one node (and its cached LoRA copies),
// the chunked linear cross-entropy, activation checkpointing (with dropout),
// the fused AdamW, the step read-back, the FLOPs count and the micro-batch probe.
// Runs on TRAINERD_TEST_DEVICE / TRAINERD_TEST_DTYPE (CPU float32 in CI).
#include <cmath>
#include <map>
#include <mutex>
#include <set>

#include "engine/activation_checkpoint.h"
#include "engine/batch.h"
#include "engine/epilogue_gemm.h"
#include "engine/flops.h"
#include "engine/fused_ops.h"
#include "engine/fused_adamw.h"
#include "engine/linear.h"
#include "engine/linear_group.h"
#include "engine/linear_cross_entropy.h"
#include "engine/llama_model.h"
#include "engine/lora.h"
#include "engine/micro_batch_probe.h"
#include "engine/model_config.h"
#include "engine/step_readback.h"
#include "engine/tensor_io.h"
#include "tests/engine/test_support.h"
#include "tests/engine/wide_rows.h"

namespace trainerd::testing {
namespace {

std::unique_ptr<engine::LlamaModel> FixtureModel(double lora_dropout) {
  auto config = engine::LoadModelConfig(Fixture("llama/model"));
  EXPECT_TRUE(config.ok());
  auto weights = engine::LoadModelWeights(Fixture("llama/model"), TorchTestDtype(), TorchTestDevice());
  EXPECT_TRUE(weights.ok());
  auto model = engine::LlamaModel::FromWeights(*config, std::move(*weights), "fixture");
  EXPECT_TRUE(model.ok());
  engine::LoraSettings s;
  s.r = 4;
  s.alpha = 8;
  s.dropout = lora_dropout;
  s.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  engine::AttachLora(**model, s);
  // PEFT starts B at zero; random B makes every adapter's gradient path count.
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : engine::LoraNamedParameters(**model)) {
    if (name.find("lora_B") != std::string::npos) t.normal_(0, 0.05);
  }
  return std::move(*model);
}

// Two rows of different lengths (the shorter right-padded), random ids.
engine::Batch RandomBatch(const engine::LlamaModel& model, std::vector<engine::TokenExample>& storage) {
  torch::manual_seed(11);
  storage.clear();
  for (int64_t len : {23, 17}) {
    engine::TokenExample ex;
    torch::Tensor ids = torch::randint(0, model.config().vocab_size, {len}, torch::kInt64);
    ex.input_ids.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + len);
    ex.labels = ex.input_ids;
    ex.labels[3] = engine::kIgnoreIndex;
    storage.push_back(ex);
  }
  return engine::MakeBatch({&storage[0], &storage[1]}, model.device());
}

std::vector<torch::Tensor> Gradients(const engine::LlamaModel& model) {
  std::vector<torch::Tensor> out;
  for (const auto& [_, t] : engine::LoraNamedParameters(model)) out.push_back(t.grad().detach().clone());
  return out;
}

void ZeroGradients(const engine::LlamaModel& model) {
  for (const auto& [_, t] : engine::LoraNamedParameters(model)) t.mutable_grad() = torch::Tensor();
}

TEST(LinearCrossEntropy, MatchesPlainCrossEntropyInEveryChunking) {
  torch::manual_seed(5);
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  const int64_t n = 37, h = 24, v = 101;
  torch::Tensor hidden0 = torch::randn({n, h}, opts), weight0 = torch::randn({v, h}, opts) * 0.3;
  torch::Tensor targets = torch::randint(0, v, {n}, torch::TensorOptions().dtype(torch::kInt64).device(opts.device()));
  targets.index_put_({torch::tensor({0, 5, 36})}, -100);

  torch::Tensor hr = hidden0.clone().requires_grad_(true), wr = weight0.clone().requires_grad_(true);
  torch::Tensor ref = torch::nn::functional::cross_entropy(
      torch::mm(hr, wr.t()), targets,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
  (ref * 0.7).backward();

  for (int64_t chunk_elements : {int64_t{1}, v * 5, v * 36, v * 37, v * 1000}) {
    torch::Tensor hc = hidden0.clone().requires_grad_(true), wc = weight0.clone().requires_grad_(true);
    torch::Tensor loss = engine::LinearCrossEntropySum(hc, wc, targets, -100, chunk_elements);
    EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
    EXPECT_LE(RelativeError(loss, ref), 1e-6) << chunk_elements;
    (loss * 0.7).backward();
    EXPECT_LE(RelativeError(hc.grad(), hr.grad()), 1e-5) << chunk_elements;
    EXPECT_LE(RelativeError(wc.grad(), wr.grad()), 1e-5) << chunk_elements;
  }
  // Without gradients (evaluation) it is the same sum and keeps nothing.
  torch::NoGradGuard no_grad;
  EXPECT_LE(RelativeError(engine::LinearCrossEntropySum(hidden0, weight0, targets, -100, v * 4), ref), 1e-6);
}

// Checkpointed layers give the loss and adapter gradients of the plain pass,
// with LoRA dropout on (the second run must draw the same mask), whether every
// layer recomputes or only the first (gradient_checkpointing_layers: 1).
TEST(ActivationCheckpointing, SameLossAndGradientsWithDropout) {
  std::map<double, double> plain_loss;  // by dropout
  // (0.0, 1): the kept layer's down group makes its SwiGLU input again (InputRecipe).
  for (auto [dropout, layers] : {std::pair<double, int64_t>{0.0, 0}, {0.0, 1}, {0.3, 0}, {0.3, 1}}) {
    SCOPED_TRACE("checkpointed layers " + std::to_string(layers) + " (0: all)");
    auto model = FixtureModel(dropout);
    // A training forward draws dropout masks only where a module has dropout.
    EXPECT_EQ(model->HasDropout(), dropout > 0);
    model->set_training(true);
    std::vector<engine::TokenExample> storage;
    engine::Batch batch = RandomBatch(*model, storage);

    torch::manual_seed(21);
    torch::Tensor plain = engine::CausalLmLossSum(*model, batch);
    plain_loss[dropout] = plain.item<double>();
    plain.backward();
    std::vector<torch::Tensor> plain_grads = Gradients(*model);
    ZeroGradients(*model);

    model->set_gradient_checkpointing(true, layers);
    ASSERT_GE(model->layers().size(), 2u);
    EXPECT_EQ(model->checkpointed_layers(), layers == 0 ? static_cast<int64_t>(model->layers().size()) : layers);
    torch::manual_seed(21);
    torch::Tensor ckpt = engine::CausalLmLossSum(*model, batch);
    ckpt.backward();
    std::vector<torch::Tensor> ckpt_grads = Gradients(*model);

    EXPECT_LE(RelativeError(ckpt, plain), TestTolerances().loss) << "dropout " << dropout;
    ASSERT_EQ(plain_grads.size(), ckpt_grads.size());
    for (size_t i = 0; i < plain_grads.size(); ++i) {
      EXPECT_LE(RelativeError(ckpt_grads[i], plain_grads[i]), TestTolerances().loss * 10)
          << "dropout " << dropout << " tensor " << i;
    }
    // Layer 0's adapters got gradients although the embedding output needs none.
    EXPECT_GT(ckpt_grads[0].abs().sum().item<double>(), 0);
  }
  // The masks applied: dropout changed the loss (LoRA B is random here) by
  // more than rounding moves it (measured: 1.7% in bfloat16 on CUDA).
  EXPECT_GT(std::abs(plain_loss[0.3] - plain_loss[0.0]), 0.005 * std::abs(plain_loss[0.0]));
}

// Nodes of loss's autograd graph whose name holds SiLU's or SwiGLU's (the
// CPU's SiluBackward, the kernel's SwiGluFunction node).
int SwiGluNodes(const torch::Tensor& loss) {
  std::vector<torch::autograd::Node*> todo{loss.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  int found = 0;
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    const std::string name = node->name();
    if (name.find("Silu") != std::string::npos || name.find("SwiGlu") != std::string::npos) ++found;
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function.get());
  }
  return found;
}

// SwiGLU's backward taken into down's node (engine/epilogue_gemm.h, level 2):
// the loss and adapter gradients of SwiGLU's own node, with LoRA dropout
// (down's dropout terms go into dh before SwiGLU's backward) and with every
// layer or only the first recomputed (the kept layers' down makes h again
// from gate and up). At level 3 as well: gate|up's node hands its t and a
// buffer for its B gradients to down's node, and no layer keeps h. On the
// CPU and at the fixture's sizes the GEMM of our own takes nothing: this is
// the graph's plumbing and SwiGluGradients (gate|up's backward then makes
// its own B gradients, down makes h again from gate and up).
TEST(SwiGluInDown, SameLossAndGradientsAsSwiGlusOwnNode) {
  for (auto [dropout, layers] : {std::pair<double, int64_t>{0.0, -1}, {0.0, 0}, {0.0, 1}, {0.3, -1}, {0.3, 1}}) {
    SCOPED_TRACE("dropout " + std::to_string(dropout) + ", checkpointed layers " + std::to_string(layers) +
                 " (-1: none, 0: all)");
    auto model = FixtureModel(dropout);
    model->set_training(true);
    if (layers >= 0) model->set_gradient_checkpointing(true, layers);
    std::vector<engine::TokenExample> storage;
    engine::Batch batch = RandomBatch(*model, storage);
    auto run = [&](int level) {
      engine::SetSwiGluGemm(level);
      ZeroGradients(*model);
      torch::manual_seed(21);
      torch::Tensor loss = engine::CausalLmLossSum(*model, batch);
      // SwiGLU's node leaves the graph with the switch (recomputed layers'
      // graphs are the checkpoint's own, out of sight).
      if (layers < 0) {
        EXPECT_EQ(SwiGluNodes(loss) > 0, level < 2) << "level " << level;
      }
      loss.backward();
      engine::SetSwiGluGemm(0);
      return std::make_pair(loss.detach(), Gradients(*model));
    };
    const auto [own_loss, own_grads] = run(0);
    for (int level : {2, 3}) {
      SCOPED_TRACE("level " + std::to_string(level));
      const auto [down_loss, down_grads] = run(level);
      EXPECT_LE(RelativeError(down_loss, own_loss), TestTolerances().loss);
      ASSERT_EQ(down_grads.size(), own_grads.size());
      for (size_t i = 0; i < own_grads.size(); ++i) {
        EXPECT_LE(RelativeError(down_grads[i], own_grads[i]), TestTolerances().loss * 10) << "tensor " << i;
      }
    }
  }
}

// Down's node with SwiGLU's inputs takes t = x A^T from x's spare columns
// where gate|up's GEMM made it (SwiGluInput::lora_t_made; engine/
// epilogue_gemm.h, DownLoraInGateUpEnabled): given the product there, its
// output and every gradient are those of the node that makes t itself; given
// zeros there, its output is x W^T alone (it took the columns as they were);
// with LoRA dropout it makes t from the dropped rows whatever the flag.
// CurrentLoraA gives the copy of A that the node reads.
TEST(SwiGluInDown, TakesTheLoraProductGateUpsGemmMade) {
  torch::manual_seed(13);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  const int64_t n = 10, f = 24, out = 16;
  engine::Linear down;
  down.name = "down";
  down.weight = torch::randn({out, f}, opts) * 0.2;
  engine::LoraWeights lora;
  lora.a = (torch::randn({4, f}, f32) * 0.3).set_requires_grad(true);
  lora.b = (torch::randn({out, 4}, f32) * 0.3).set_requires_grad(true);
  lora.scaling = 2.0;
  down.lora = lora;
  engine::LinearGroup group;
  engine::Widen(group, {&down});
  const engine::GroupMembers members{&group, {&down}};
  const torch::Tensor a = engine::CurrentLoraA(members);
  ASSERT_TRUE(a.defined());
  EXPECT_TRUE(torch::equal(a, lora.a.detach().to(TorchTestDtype()))) << "A in the model dtype";
  const torch::Tensor gate_up = torch::randn({n, 2 * f}, opts);
  const torch::Tensor weights = torch::linspace(-1, 1, out, f32);
  // {output, d[gate | up], dA, dB}; x's spare columns hold x A^T or zeros
  // before the forward.
  auto run = [&](bool made, bool product_there, const engine::DropoutMasks& masks) {
    const torch::Tensor gu = gate_up.clone().requires_grad_(true);
    const torch::Tensor gate = gu.narrow(1, 0, f), up = gu.narrow(1, f, f);
    const torch::Tensor rows = torch::zeros({n, f + group.cols}, opts);
    const torch::Tensor x = rows.narrow(1, 0, f);
    {
      const torch::NoGradGuard no_grad;
      x.copy_(torch::silu(gate) * up);
      if (product_there) rows.narrow(1, f, 4).copy_(torch::mm(x, a.t()));
    }
    const engine::SwiGluInput input{gate, up, {}, {}, {}, 0, 0, made};
    const std::vector<torch::Tensor> ys = engine::ForwardGroup(members, x, {}, masks, nullptr, &input);
    down.lora->a.mutable_grad() = torch::Tensor();
    down.lora->b.mutable_grad() = torch::Tensor();
    (ys[0].to(torch::kFloat32) * weights).sum().backward();
    return std::vector<torch::Tensor>{ys[0].detach(), gu.grad(), down.lora->a.grad().clone(),
                                      down.lora->b.grad().clone(), x.detach().clone()};
  };
  const double tolerance = TestTolerances().loss;
  const std::vector<torch::Tensor> own = run(false, false, {});
  const std::vector<torch::Tensor> taken = run(true, true, {});
  for (size_t i = 0; i < 4; ++i) EXPECT_LE(RelativeError(taken[i], own[i]), tolerance) << "result " << i;
  const std::vector<torch::Tensor> zeros = run(true, false, {});
  EXPECT_LE(RelativeError(zeros[0], torch::mm(zeros[4], down.weight.t())), tolerance) << "the columns as they were";
  // The LoRA term is about as large as x W^T here: far above any dtype's tolerance.
  EXPECT_GT(Report("the LoRA term's share of down's output", RelativeError(zeros[0], own[0])), 0.2);
  // Dropout on down's LoRA: the node makes t itself, from the dropped rows.
  const engine::DropoutDraw draw = engine::NewDropoutDraw(TorchTestDevice(), 8);
  down.lora->dropout = 0.5;
  const std::vector<torch::Tensor> dropped_own = run(false, false, {&draw, 3});
  const std::vector<torch::Tensor> dropped_flagged = run(true, false, {&draw, 3});
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_LE(RelativeError(dropped_flagged[i], dropped_own[i]), tolerance) << "dropout, result " << i;
  }
  EXPECT_GT(Report("dropout's change of down's output", RelativeError(dropped_own[0], own[0])), 0.2);
}

// Identity whose backward hands on its output gradient as the left part of
// rows `spare` elements wider, NaN in the spare columns, as the norm after a
// down projection does (FusedAddRmsNorm's gradient_spare_columns); the rows'
// buffer goes to *rows, so that a test can see what was written there.
class WideGradientRowsFunction : public torch::autograd::Function<WideGradientRowsFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& y, int64_t spare,
                               torch::Tensor* rows) {
    ctx->saved_data["spare"] = spare;
    ctx->saved_data["rows"] = reinterpret_cast<int64_t>(rows);
    return y.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor g = grads[0].reshape({-1, grads[0].size(-1)});
    auto* rows = reinterpret_cast<torch::Tensor*>(ctx->saved_data["rows"].toInt());
    *rows = torch::full({g.size(0), g.size(1) + ctx->saved_data["spare"].toInt()}, NAN, g.options());
    torch::Tensor left = rows->narrow(1, 0, g.size(1));
    left.copy_(g);
    return {left.view(grads[0].sizes()), torch::Tensor(), torch::Tensor()};
  }
};

// The widened group node (engine/linear_group.h) gives each layer's Forward
// outputs and the same gradients for the input and every LoRA matrix: a
// q|k|v-like group with a bias on one layer and no LoRA on another; an input
// that needs no gradient (the first layer's), where the adapters must still
// get theirs; and an input a producer wrote into rows with the group's spare
// columns (used in place, not copied), as a producer's custom Function made
// it (WideRowsFunction). Run twice, so the second forward
// rewrites the widened matrix's B columns from B after a change to B, then
// twice more with LoRA dropout, each side given the same masks.
TEST(LinearGroup, MatchesTheLayersOneByOne) {
  torch::manual_seed(5);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  const int64_t in = 24;
  std::vector<engine::Linear> layers(3);
  const int64_t outs[3] = {16, 8, 8};
  for (int i = 0; i < 3; ++i) {
    layers[i].name = "layer" + std::to_string(i);
    layers[i].weight = torch::randn({outs[i], in}, opts) * 0.2;
    if (i == 1) layers[i].bias = torch::randn({outs[i]}, opts);
    if (i != 2) {
      engine::LoraWeights w;
      w.a = (torch::randn({i == 0 ? 4 : 3, in}, f32) * 0.3).set_requires_grad(true);
      w.b = (torch::randn({outs[i], i == 0 ? 4 : 3}, f32) * 0.3).set_requires_grad(true);
      w.scaling = i == 0 ? 2.0 : 0.5;
      layers[i].lora = w;
    }
  }
  // The widened copies share the LoRA parameters; their weights move into the group.
  std::vector<engine::Linear> widened = layers;
  engine::LinearGroup group;
  engine::Widen(group, {&widened[0], &widened[1], &widened[2]});
  ASSERT_EQ(group.cols, 8);  // ranks 4 + 3, padded to 8
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(torch::equal(widened[i].weight, layers[i].weight)) << "weight " << i;
    EXPECT_TRUE(widened[i].weight.is_alias_of(group.widened)) << "weight " << i;
  }
  std::vector<const engine::Linear*> plain_members{&layers[0], &layers[1], &layers[2]};
  std::vector<const engine::Linear*> group_members{&widened[0], &widened[1], &widened[2]};
  // Rounds 2 and 3: LoRA dropout, masks 5, 6, 7 of a draw (the third module
  // has no adapter), the same masks for both sides; on both adapters with
  // different p, then on the first alone (the second's p 0 in a group with dropout).
  const engine::DropoutDraw draw = engine::NewDropoutDraw(TorchTestDevice(), 8);
  std::vector<torch::Tensor> undropped;  // a dropout round's first outputs without dropout
  for (int round = 0; round < 4; ++round) {
    const bool dropout = round >= 2;
    if (dropout) {
      layers[0].lora->dropout = widened[0].lora->dropout = 0.5;
      layers[1].lora->dropout = widened[1].lora->dropout = round == 2 ? 0.25 : 0.0;
    }
    const engine::DropoutMasks masks{dropout ? &draw : nullptr, 5};
    for (int input = 0; input < 3; ++input) {  // 0: needs grad; 1: needs none; 2: in wider rows
      const bool input_needs_grad = input != 1;
      // Forward, then a loss that weighs every output differently.
      auto run = [&](bool grouped) {
        torch::Tensor p = torch::randn({2, 5, in}, opts).requires_grad_(input_needs_grad);
        torch::Tensor x = p;
        if (grouped && input == 2) x = WideRowsFunction::apply(p.view({10, in}), group.cols);  // spare: junk
        std::vector<torch::Tensor> ys;
        if (grouped) {
          ys = engine::ForwardGroup(group, group_members, x, {}, masks);
          if (dropout && input == 0) {
            const torch::NoGradGuard no_grad;
            undropped = engine::ForwardGroup(group, group_members, x);
          }
        } else {
          for (size_t i = 0; i < plain_members.size(); ++i) {
            ys.push_back(plain_members[i]->Forward(x, {masks.draw, masks.first + static_cast<int64_t>(i)}));
          }
        }
        torch::Tensor loss = torch::zeros({}, f32);
        for (size_t i = 0; i < ys.size(); ++i) {
          EXPECT_EQ(ys[i].size(-1), outs[i]);
          loss = loss + (ys[i].to(torch::kFloat32) * torch::linspace(-1, 1, outs[i], f32) * double(i + 1)).sum();
        }
        for (auto& l : layers) {
          if (l.lora) {
            l.lora->a.mutable_grad() = torch::Tensor();
            l.lora->b.mutable_grad() = torch::Tensor();
          }
        }
        loss.backward();
        std::vector<torch::Tensor> out;
        for (const auto& y : ys) out.push_back(y.reshape({-1, y.size(-1)}));
        if (input_needs_grad) out.push_back(p.grad());
        for (auto& l : layers) {
          if (l.lora) {
            out.push_back(l.lora->a.grad().clone());
            out.push_back(l.lora->b.grad().clone());
          }
        }
        return out;
      };
      torch::manual_seed(9 + input);
      const std::vector<torch::Tensor> plain = run(false);
      torch::manual_seed(9 + input);
      const std::vector<torch::Tensor> grouped = run(true);
      ASSERT_EQ(plain.size(), grouped.size());
      for (size_t i = 0; i < plain.size(); ++i) {
        ASSERT_TRUE(grouped[i].defined()) << "tensor " << i;
        EXPECT_LE(RelativeError(grouped[i], plain[i]), TestTolerances().loss * 10)
            << "tensor " << i << " (round " << round << ", input " << input << ")";
      }
      if (dropout && input == 0) {
        // The masks applied: the outputs of the adapters with dropout moved,
        // the others did not.
        for (size_t i = 0; i < 3; ++i) {
          const torch::Tensor before = undropped[i].reshape({-1, outs[i]});
          if (layers[i].lora && layers[i].lora->dropout > 0) {
            EXPECT_GT(RelativeError(grouped[i], before), 0.01) << "member " << i << ", round " << round;
          } else {
            EXPECT_LE(RelativeError(grouped[i], before), TestTolerances().loss)
                << "member " << i << ", round " << round;
          }
        }
      }
    }
    torch::NoGradGuard no_grad;
    for (auto& l : layers) {
      if (l.lora) l.lora->b.add_(0.1);
    }
  }
}

// One LoRA layer (float32 adapter, random B) and its widened group; the
// group's copy of the layer shares the adapter.
struct OneLayerGroup {
  engine::Linear layer, widened;
  engine::LinearGroup group;

  OneLayerGroup(int64_t out, int64_t in, int64_t rank, double scaling) {
    const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
    layer.weight = torch::randn({out, in}, opts) * 0.2;
    layer.lora = engine::LoraWeights{(torch::randn({rank, in}, f32) * 0.3).set_requires_grad(true),
                                     (torch::randn({out, rank}, f32) * 0.3).set_requires_grad(true), scaling, 0.0};
    widened = layer;
    engine::Widen(group, {&widened});
  }

  void SetDropout(double p) { layer.lora->dropout = widened.lora->dropout = p; }

  // The output, input gradient and adapter gradients of the layer alone or
  // as the group, for a loss weighing each output column differently; sets
  // *dense_input_gradient to whether the input's gradient came dense.
  // gradient_rows: when given, y's gradient reaches the layer as the left
  // part of rows with the group's gradient_spare_columns (WideGradientRowsFunction).
  // masks: LoRA dropout's (with the adapter's p), for both the layer and the group.
  std::vector<torch::Tensor> Run(const torch::Tensor& x0, bool grouped, bool* dense_input_gradient = nullptr,
                                 torch::Tensor* gradient_rows = nullptr, const engine::DropoutMasks& masks = {}) {
    torch::Tensor x = x0.clone().requires_grad_();
    if (dense_input_gradient != nullptr) {
      x.register_hook([dense_input_gradient](const torch::Tensor& g) { *dense_input_gradient = g.is_contiguous(); });
    }
    torch::Tensor y = grouped ? engine::ForwardGroup(group, {&widened}, x, {}, masks)[0] : layer.Forward(x, masks);
    if (gradient_rows != nullptr) {
      y = WideGradientRowsFunction::apply(y, group.gradient_spare_columns(), gradient_rows);
    }
    layer.lora->a.mutable_grad() = torch::Tensor();
    layer.lora->b.mutable_grad() = torch::Tensor();
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
    (y.to(torch::kFloat32) * torch::linspace(-1, 1, y.size(-1), f32)).sum().backward();
    return {y, x.grad(), layer.lora->a.grad().clone(), layer.lora->b.grad().clone()};
  }
};

void ExpectSameTensors(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(RelativeError(got[i], want[i]), TestTolerances().loss * 10) << "tensor " << i;
  }
}

// Where the adapter's .grad already holds a gradient (a step's later
// micro-batches; every micro-batch under CUDA graphs), the group adds its own
// into that tensor in its batch of casts, as autograd adds the layer's: the
// same sums, in the same tensors.
TEST(LinearGroup, AddsIntoGradientsAlreadyThere) {
  torch::manual_seed(11);
  OneLayerGroup g(12, 20, 4, 2.0);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  const torch::Tensor x = torch::randn({6, 20}, opts);
  torch::Tensor& a = g.layer.lora->a;
  torch::Tensor& b = g.layer.lora->b;
  const torch::Tensor before_a = torch::randn(a.sizes(), f32), before_b = torch::randn(b.sizes(), f32);
  auto run = [&](bool grouped) {
    a.mutable_grad() = before_a.clone();
    b.mutable_grad() = before_b.clone();
    const torch::Tensor grad_a = a.grad(), grad_b = b.grad();
    const torch::Tensor y =
        grouped ? engine::ForwardGroup(g.group, {&g.widened}, x)[0] : g.layer.Forward(x);
    (y.to(torch::kFloat32) * torch::linspace(-1, 1, y.size(-1), f32)).sum().backward();
    EXPECT_TRUE(a.grad().is_same(grad_a) && b.grad().is_same(grad_b)) << (grouped ? "group" : "layer");
    return std::vector<torch::Tensor>{a.grad().clone(), b.grad().clone()};
  };
  const std::vector<torch::Tensor> plain = run(false);
  ExpectSameTensors(run(true), plain);
  // The gradients were added: they are not the ones that were there.
  EXPECT_GT((plain[0] - before_a).abs().max().item<double>(), 0.1);
  EXPECT_GT((plain[1] - before_b).abs().max().item<double>(), 0.1);
}

// A group whose input is wider than its output (down) keeps its A's in rows
// below the weights and takes u A inside the input gradient's GEMM: the same
// gradients as the layer on its own; also when its output gradient comes in
// rows with room for u (gradient_spare_columns), which it then fills in
// place: u and the padding's zeros replace the NaNs there.
TEST(LinearGroup, WiderInputTakesTheLoraTermInItsGemm) {
  torch::manual_seed(7);
  OneLayerGroup g(8, 40, 3, 1.5);
  EXPECT_EQ(g.group.a_rows, 8);  // rank 3, padded
  EXPECT_EQ(g.group.widened.size(0), 16);
  EXPECT_EQ(g.group.gradient_spare_columns(), 8);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const torch::Tensor x = torch::randn({5, 40}, opts);
  const std::vector<torch::Tensor> plain = g.Run(x, false);
  ExpectSameTensors(g.Run(x, true), plain);
  torch::Tensor rows;
  ExpectSameTensors(g.Run(x, true, nullptr, &rows), plain);
  ASSERT_TRUE(rows.defined());
  EXPECT_EQ(rows.sizes(), (std::vector<int64_t>{5, 16}));
  EXPECT_FALSE(rows.isnan().any().item<bool>()) << "the spare columns were not written in place";
  EXPECT_TRUE(torch::equal(rows.narrow(1, 11, 5), torch::zeros({5, 5}, opts))) << "the padding";
}

// Whether the (only) tensor that holds x's storage lets it go: false while
// something (an autograd node) still keeps it.
bool FreedWhenDropped(torch::Tensor& x) {
  const auto weak = x.storage().getWeakStorageImpl();
  x = torch::Tensor();
  return weak.expired();
}

// Given how its input was made (engine::InputRecipe), a group keeps that
// instead of the input and computes the same outputs and gradients as the
// layers one by one on the plain formulas: q|k-like after RMSNorm (the A
// gradients from the norm's input and 1/rms), down-like after SwiGLU (the
// input made again in the backward). An input the node keeps is not freed
// when its last other holder lets go; with a recipe it is.
TEST(LinearGroup, InputRecipesKeepNoInputAndGiveTheSameGradients) {
  torch::manual_seed(12);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  auto lora_layer = [&](int64_t out, int64_t in, int64_t rank, double scaling) {
    engine::Linear l;
    l.weight = torch::randn({out, in}, opts) * 0.2;
    l.lora = engine::LoraWeights{(torch::randn({rank, in}, f32) * 0.3).set_requires_grad(true),
                                 (torch::randn({out, rank}, f32) * 0.3).set_requires_grad(true), scaling, 0.0};
    return l;
  };
  auto clear_grads = [](std::vector<engine::Linear>& layers) {
    for (auto& l : layers) {
      l.lora->a.mutable_grad() = torch::Tensor();
      l.lora->b.mutable_grad() = torch::Tensor();
    }
  };
  auto lora_grads = [](const std::vector<engine::Linear>& layers) {
    std::vector<torch::Tensor> out;
    for (const auto& l : layers) {
      out.push_back(l.lora->a.grad().clone());
      out.push_back(l.lora->b.grad().clone());
    }
    return out;
  };
  auto expect_close = [](const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want,
                         const std::string& what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LE(RelativeError(got[i], want[i]), TestTolerances().loss * 10) << what << ", tensor " << i;
    }
  };
  const double eps = 1e-5;
  // With LoRA dropout: the same masks for both sides; the nodes then keep (or
  // make again, after SwiGLU) the input the masks apply to.
  const engine::DropoutDraw draw = engine::NewDropoutDraw(TorchTestDevice(), 2);
  const engine::DropoutMasks masks{&draw, 0};
  auto set_dropout = [](std::vector<engine::Linear>& layers, double p) {
    for (auto& l : layers) l.lora->dropout = p;
  };

  {  // RMSNorm, then a q|k-like group.
    const int64_t in = 24;
    std::vector<engine::Linear> layers{lora_layer(16, in, 4, 2.0), lora_layer(8, in, 3, 0.5)};
    std::vector<engine::Linear> widened = layers;
    engine::LinearGroup group;
    engine::Widen(group, {&widened[0], &widened[1]});
    const std::vector<const engine::Linear*> members{&widened[0], &widened[1]};
    const torch::Tensor h0 = torch::randn({2, 5, in}, opts) * 3;
    const torch::Tensor w = torch::rand({in}, opts) + 0.5;
    auto run = [&](bool grouped, const engine::DropoutMasks& m = {}) {
      clear_grads(layers);
      torch::Tensor h = h0.clone().requires_grad_(true);
      std::vector<torch::Tensor> ys;
      if (grouped) {
        engine::InputRecipe recipe;
        recipe.norm_input = h;
        recipe.norm_weight = w;
        const torch::Tensor x = engine::FusedRmsNorm(h, w, eps, group.spare_columns(), &recipe.norm_rstd);
        ys = engine::ForwardGroup(group, members, x, recipe, m);
      } else {
        const torch::Tensor x = engine::PlainRmsNorm(h, w, eps);
        for (size_t i = 0; i < layers.size(); ++i) ys.push_back(layers[i].Forward(x, {m.draw, m.first + int64_t(i)}));
      }
      torch::Tensor loss = torch::zeros({}, f32);
      for (size_t i = 0; i < ys.size(); ++i) {
        loss = loss + (ys[i].to(torch::kFloat32) * torch::linspace(-1, 1, ys[i].size(-1), f32) * double(i + 1)).sum();
      }
      loss.backward();
      std::vector<torch::Tensor> out{ys[0], ys[1], h.grad()};
      for (const auto& g : lora_grads(layers)) out.push_back(g);
      return out;
    };
    const auto plain = run(false);
    expect_close(run(true), plain, "after RMSNorm");

    // The node's hold on its input: kept without a recipe, not with one.
    torch::Tensor rstd;
    torch::Tensor x = engine::PlainRmsNorm(h0, w, eps, &rstd);
    const auto kept = engine::ForwardGroup(group, members, x);  // the node lives while its outputs do
    EXPECT_FALSE(FreedWhenDropped(x)) << "the control: a node without a recipe keeps its input";
    x = engine::PlainRmsNorm(h0, w, eps);
    engine::InputRecipe recipe;
    recipe.norm_input = h0;
    recipe.norm_rstd = rstd;
    recipe.norm_weight = w;
    clear_grads(layers);
    const auto ys = engine::ForwardGroup(group, members, x, recipe);
    EXPECT_TRUE(FreedWhenDropped(x)) << "the node kept its input although the recipe makes it";
    (ys[0].to(torch::kFloat32).sum() + ys[1].to(torch::kFloat32).sum()).backward();
    EXPECT_TRUE(layers[0].lora->a.grad().defined());

    set_dropout(layers, 0.3);
    set_dropout(widened, 0.3);
    expect_close(run(true, masks), run(false, masks), "after RMSNorm, with dropout");
    x = engine::PlainRmsNorm(h0, w, eps);
    const auto dropped = engine::ForwardGroup(group, members, x, recipe, masks);
    EXPECT_FALSE(FreedWhenDropped(x)) << "with dropout the node must keep the input its masks apply to";
  }

  {  // SwiGLU, then a down-like group (input wider than output).
    const int64_t in = 40;
    std::vector<engine::Linear> layers{lora_layer(8, in, 3, 1.5)};
    std::vector<engine::Linear> widened = layers;
    engine::LinearGroup group;
    engine::Widen(group, {&widened[0]});
    const torch::Tensor gate_up0 = torch::randn({5, 2 * in}, opts);
    auto run = [&](bool grouped, const engine::DropoutMasks& m = {}) {
      clear_grads(layers);
      torch::Tensor gate_up = gate_up0.clone().requires_grad_(true);
      const torch::Tensor gate = gate_up.narrow(1, 0, in), up = gate_up.narrow(1, in, in);
      torch::Tensor y;
      if (grouped) {
        engine::InputRecipe recipe;
        recipe.gate = gate;
        recipe.up = up;
        const torch::Tensor act = engine::FusedSwiGlu(gate, up, group.spare_columns());
        y = engine::ForwardGroup(group, {&widened[0]}, act, recipe, m)[0];
      } else {
        y = layers[0].Forward(engine::PlainSwiGlu(gate, up), m);
      }
      (y.to(torch::kFloat32) * torch::linspace(-1, 1, 8, f32)).sum().backward();
      std::vector<torch::Tensor> out{y, gate_up.grad()};
      for (const auto& g : lora_grads(layers)) out.push_back(g);
      return out;
    };
    const auto plain = run(false);
    expect_close(run(true), plain, "after SwiGLU");

    const torch::Tensor gate = gate_up0.narrow(1, 0, in), up = gate_up0.narrow(1, in, in);
    torch::Tensor act = engine::PlainSwiGlu(gate, up);
    engine::InputRecipe recipe;
    recipe.gate = gate;
    recipe.up = up;
    const auto kept = engine::ForwardGroup(group, {&widened[0]}, act, recipe);
    EXPECT_TRUE(FreedWhenDropped(act)) << "the node kept its input although the recipe makes it";

    set_dropout(layers, 0.3);
    set_dropout(widened, 0.3);
    expect_close(run(true, masks), run(false, masks), "after SwiGLU, with dropout");
    act = engine::PlainSwiGlu(gate, up);
    const auto dropped = engine::ForwardGroup(group, {&widened[0]}, act, recipe, masks);
    EXPECT_TRUE(FreedWhenDropped(act)) << "with dropout too, SwiGLU's recipe makes the input again";
  }
}

// LoRA dropout on the node's other layouts: a group with A rows (down), whose
// input gradient then takes the masked terms after its GEMM (also with its
// output gradient in rows with room for u), and a group asked for a dense
// input gradient (o): the layer's outputs and gradients under the same masks,
// and not the ones without dropout.
TEST(LinearGroup, LoraDropoutOnEveryLayout) {
  torch::manual_seed(17);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const engine::DropoutDraw draw = engine::NewDropoutDraw(TorchTestDevice(), 4);
  const engine::DropoutMasks masks{&draw, 3};
  auto expect_moved = [](const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& undropped) {
    for (size_t i = 0; i < got.size(); ++i) EXPECT_GT(RelativeError(got[i], undropped[i]), 0.01) << "tensor " << i;
  };
  {
    OneLayerGroup down(8, 40, 3, 1.5);
    const torch::Tensor x = torch::randn({5, 40}, opts);
    const std::vector<torch::Tensor> undropped = down.Run(x, false);
    down.SetDropout(0.4);
    const std::vector<torch::Tensor> plain = down.Run(x, false, nullptr, nullptr, masks);
    expect_moved(plain, undropped);
    ExpectSameTensors(down.Run(x, true, nullptr, nullptr, masks), plain);
    torch::Tensor rows;
    ExpectSameTensors(down.Run(x, true, nullptr, &rows, masks), plain);
  }
  {
    OneLayerGroup o(24, 24, 4, 2.0);
    o.group.dense_input_gradient = true;
    const torch::Tensor x = torch::randn({6, 24}, opts);
    const std::vector<torch::Tensor> undropped = o.Run(x, false);
    o.SetDropout(0.2);
    const std::vector<torch::Tensor> plain = o.Run(x, false, nullptr, nullptr, masks);
    expect_moved(plain, undropped);
    bool dense = false;
    ExpectSameTensors(o.Run(x, true, &dense, nullptr, masks), plain);
    EXPECT_TRUE(dense);
  }
}

// A group without LoRA (a projection the adapters do not target): the stacked
// frozen product, no widening, the input gradient as one by one.
TEST(LinearGroup, WithoutLoraIsTheStackedProduct) {
  torch::manual_seed(6);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  std::vector<engine::Linear> layers(2);
  for (int i = 0; i < 2; ++i) layers[i].weight = torch::randn({8 + 4 * i, 16}, opts) * 0.2;
  std::vector<engine::Linear> widened = layers;
  engine::LinearGroup group;
  engine::Widen(group, {&widened[0], &widened[1]});
  EXPECT_EQ(group.cols, 0);
  EXPECT_EQ(group.spare_columns(), 0);
  torch::Tensor x = torch::randn({3, 16}, opts).requires_grad_();
  torch::Tensor x2 = x.detach().clone().requires_grad_();
  const auto ys = engine::ForwardGroup(group, {&widened[0], &widened[1]}, x);
  (ys[0].sum() + 2 * ys[1].sum()).backward();
  (layers[0].Forward(x2).sum() + 2 * layers[1].Forward(x2).sum()).backward();
  for (int i = 0; i < 2; ++i) {
    EXPECT_LE(RelativeError(ys[i], layers[i].Forward(x2)), TestTolerances().loss * 10) << "member " << i;
  }
  EXPECT_LE(RelativeError(x.grad(), x2.grad()), TestTolerances().loss * 10);
}

// A group asked for a dense input gradient (o, before attention) gives the
// same gradients as the layer on its own, and its input's producer gets the
// gradient dense; without the request it gets the left part of wider rows.
TEST(LinearGroup, DenseInputGradientOnRequest) {
  torch::manual_seed(13);
  OneLayerGroup g(24, 24, 4, 2.0);
  ASSERT_EQ(g.group.a_rows, 0);  // in == out: the input gradient comes out of the [W | sB] product
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const torch::Tensor x = torch::randn({6, 24}, opts);
  const std::vector<torch::Tensor> plain = g.Run(x, false);
  bool dense = true;
  ExpectSameTensors(g.Run(x, true, &dense), plain);
  EXPECT_FALSE(dense);
  g.group.dense_input_gradient = true;
  ExpectSameTensors(g.Run(x, true, &dense), plain);
  EXPECT_TRUE(dense);
}

// The fused AdamW (CUDA, LibTorch 2.x) and the plain one take the same steps;
// elsewhere FusedAdamW is the plain step. State stays in the optimizer.
// The model-dtype copies of the LoRA parameters (LinearGroup::LoraCopies)
// follow the parameters: after in-place changes (by hand, by the fused
// optimizer) and a new tensor, RefreshLoraCopies writes s B into its block of
// the widened matrix and A into the stacked copy (or the A rows) exactly as
// the casts would, and the forward that follows matches the layers one by
// one. A forward with nothing changed writes nothing.
TEST(LinearGroup, LoraCopiesFollowTheParameters) {
  torch::manual_seed(21);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  for (int64_t in : {int64_t{16}, int64_t{40}}) {  // 40: wider than the outputs (18): the A rows
    const std::vector<int64_t> outs{12, 6};
    const std::vector<int64_t> ranks{4, 3};
    const std::vector<double> scalings{2.0, 0.3};
    std::vector<engine::Linear> layers(2);
    for (size_t i = 0; i < 2; ++i) {
      layers[i].weight = torch::randn({outs[i], in}, opts) * 0.2;
      layers[i].lora = engine::LoraWeights{(torch::randn({ranks[i], in}, f32) * 0.3).set_requires_grad(true),
                                           (torch::randn({outs[i], ranks[i]}, f32) * 0.3).set_requires_grad(true),
                                           scalings[i], 0.0};
    }
    std::vector<engine::Linear> widened = layers;
    engine::LinearGroup group;
    engine::Widen(group, {&widened[0], &widened[1]});
    EXPECT_EQ(group.a_rows > 0, in == 40);
    const std::vector<const engine::Linear*> members{&widened[0], &widened[1]};
    const std::string what = "in " + std::to_string(in);
    // What the copies must hold: A stacked and each s B, cast once.
    auto expect_copies = [&](const std::string& when) {
      const int64_t out_total = outs[0] + outs[1];
      const torch::Tensor a_copy = group.a_rows > 0
                                       ? group.widened.narrow(0, out_total, ranks[0] + ranks[1]).narrow(1, 0, in)
                                       : group.lora_copies.a_stacked;
      EXPECT_TRUE(torch::equal(group.lora_copies.a_stacked, a_copy)) << what << " " << when;
      int64_t row = 0, col = 0;
      for (size_t i = 0; i < 2; ++i) {
        const engine::LoraWeights& w = *widened[i].lora;
        EXPECT_TRUE(torch::equal(a_copy.narrow(0, col, ranks[i]), w.a.detach().to(TorchTestDtype())))
            << what << " " << when << ": A " << i;
        const torch::Tensor b_block = group.widened.narrow(0, row, outs[i]).narrow(1, in + col, ranks[i]);
        torch::Tensor want = torch::empty({outs[i], ranks[i]}, opts);
        torch::mul_out(want, w.b.detach(), torch::scalar_tensor(scalings[i]));
        EXPECT_TRUE(torch::equal(b_block, want)) << what << " " << when << ": B " << i;
        row += outs[i];
        col += ranks[i];
      }
    };
    auto expect_forward = [&](const std::string& when) {
      const torch::Tensor x = torch::randn({7, in}, opts);
      const std::vector<torch::Tensor> ys = engine::ForwardGroup(group, members, x);
      for (size_t i = 0; i < 2; ++i) {
        EXPECT_LE(RelativeError(ys[i], layers[i].Forward(x)), TestTolerances().loss * 10)
            << what << " " << when << ": member " << i;
      }
    };
    expect_forward("first forward");
    expect_copies("first forward");
    const int64_t version = group.widened._version();
    expect_forward("nothing changed");
    EXPECT_EQ(group.widened._version(), version) << what << ": a forward with nothing changed wrote the copies";

    {
      torch::NoGradGuard no_grad;
      layers[0].lora->b.add_(0.25);
      layers[1].lora->a.mul_(-1.5);
    }
    engine::RefreshLoraCopies({{&group, members}});
    expect_copies("in-place changes");
    expect_forward("in-place changes");

    // The fused optimizer's update (on CUDA the fused kernel, elsewhere the plain step).
    for (auto& l : layers) {
      l.lora->a.mutable_grad() = torch::randn_like(l.lora->a);
      l.lora->b.mutable_grad() = torch::randn_like(l.lora->b);
    }
    torch::optim::AdamW adamw({layers[0].lora->a, layers[0].lora->b, layers[1].lora->a, layers[1].lora->b},
                              torch::optim::AdamWOptions(0.05));
    engine::FusedAdamW(adamw).Step(TorchTestDevice());
    engine::RefreshLoraCopies({{&group, members}});
    expect_copies("an optimizer step");
    expect_forward("an optimizer step");

    // A new tensor (as loading an adapter into fresh parameters would give).
    widened[1].lora->b = (torch::randn({outs[1], ranks[1]}, f32) * 0.3).set_requires_grad(true);
    layers[1].lora->b = widened[1].lora->b;
    expect_forward("a new B");  // the forward alone brings its copies up to date
    expect_copies("a new B");
  }
}

TEST(FusedAdamW, MatchesThePlainOptimizer) {
  torch::manual_seed(8);
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  std::vector<torch::Tensor> a = {torch::randn({5, 7}, opts), torch::randn({3}, opts)};
  std::vector<torch::Tensor> b = {a[0].clone(), a[1].clone()};
  for (auto& t : a) t.set_requires_grad(true);
  for (auto& t : b) t.set_requires_grad(true);
  auto options = torch::optim::AdamWOptions(1e-2).betas(std::make_tuple(0.8, 0.95)).eps(1e-6).weight_decay(0.1);
  torch::optim::AdamW plain(a, options), fused_base(b, options);
  engine::FusedAdamW fused(fused_base);
  for (int step = 0; step < 4; ++step) {
    torch::Tensor g0 = torch::randn({5, 7}, opts), g1 = torch::randn({3}, opts);
    a[0].mutable_grad() = g0.clone();
    a[1].mutable_grad() = g1.clone();
    b[0].mutable_grad() = g0.clone();
    b[1].mutable_grad() = g1.clone();
    if (step == 2) {
      for (auto& group : plain.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(3e-3);
      for (auto& group : fused_base.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(3e-3);
    }
    plain.step();
    fused.Step(TorchTestDevice());
  }
  EXPECT_LE(RelativeError(b[0], a[0]), 1e-6);
  EXPECT_LE(RelativeError(b[1], a[1]), 1e-6);
  // Each update bumped the parameters' version counters, as in-place ops do
  // (the model's LoRA copies rely on it).
  EXPECT_GE(b[0]._version(), int64_t{4});
  EXPECT_GE(b[1]._version(), int64_t{4});
  // The state a checkpoint saves: step counts and moments.
  ASSERT_EQ(fused_base.state().size(), 2u);
  for (const auto& [key, state] : fused_base.state()) {
    EXPECT_EQ(static_cast<const torch::optim::AdamWParamState&>(*state).step(), 4);
  }
}

TEST(StepReadback, ReturnsTheValuesInOrder) {
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  engine::StepReadback r;
  EXPECT_FALSE(r.started());
  r.Start({torch::full({}, 2.5, opts), torch::full({}, -1.25, opts)});
  EXPECT_TRUE(r.started());
  const std::vector<double> v = r.Wait();
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0], 2.5);
  EXPECT_EQ(v[1], -1.25);
  EXPECT_TRUE(r.started()) << "a waited-for readback can still be timed against";
}

// The device time between two steps' ends covers the work queued between
// them (CUDA); there is none to give on the CPU.
TEST(StepReadback, TimesTheDeviceBetweenSteps) {
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  engine::StepReadback first, second;
  first.Start({torch::zeros({}, opts)});
  const int64_t n = TorchTestDevice().is_cuda() ? 2048 : 64;
  torch::Tensor m = torch::randn({n, n}, opts);
  for (int i = 0; i < 20; ++i) m = torch::mm(m, m).div_(m.norm());
  second.Start({m.sum()});
  first.Wait();
  second.Wait();
  const std::optional<double> s = engine::StepReadback::SecondsBetween(first, second);
  if (TorchTestDevice().is_cuda()) {
    ASSERT_TRUE(s.has_value());
    // 20 products of 2048^3 (17 GFLOP each): more than 10 us, less than 10 s on any GPU.
    EXPECT_GT(*s, 1e-5);
    EXPECT_LT(*s, 10.0);
  } else {
    EXPECT_FALSE(s.has_value());
  }
  EXPECT_FALSE(engine::StepReadback::SecondsBetween(engine::StepReadback(), second).has_value());
}

// The FLOPs formula against the Hugging Face baseline script's
// lora_flops_per_token (bench/speed/hf_peft_baseline.py) for llama3-8b at
// seq 2048: 4 * 7,504,658,432 + 4 * 32 * 2048 * 4096 per token. The dense
// count by hand: 32 * (2*4096*4096 + 2*4096*1024 + 3*4096*14336) + 128256*4096.
TEST(Flops, MatchesTheBaselineFormula) {
  engine::ModelConfig c;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.vocab_size = 128256;
  EXPECT_DOUBLE_EQ(engine::DenseMatmulParams(c), 7504658432.0);
  const double tokens = 4 * 2048;
  const double per_token = 4 * 7504658432.0 + 4.0 * 32 * 2048 * 4096;
  EXPECT_DOUBLE_EQ(engine::TrainingStepFlops(c, false, tokens, 4 * 2048.0 * 2048.0), per_token * tokens);
  EXPECT_DOUBLE_EQ(engine::TrainingStepFlops(c, true, tokens, 0), 6 * 7504658432.0 * tokens);
  EXPECT_DOUBLE_EQ(engine::PeakBf16Flops("NVIDIA H100 80GB HBM3"), 989.4e12);
  EXPECT_DOUBLE_EQ(engine::PeakBf16Flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_DOUBLE_EQ(engine::PeakBf16Flops("NVIDIA H200"), 989.4e12);
  EXPECT_DOUBLE_EQ(engine::PeakBf16Flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(engine::PeakBf16Flops("cpu"), 0);
}

// The probe picks 1 on the CPU; on a GPU some size that fits, and either way
// the random generators are where they were (the run draws the same numbers).
TEST(MicroBatchProbe, FitsAndLeavesTheGeneratorsAlone) {
  auto model = FixtureModel(0.1);
  std::vector<engine::TokenExample> storage;
  (void)RandomBatch(*model, storage);
  engine::TokenDataset train;
  train.examples = storage;
  engine::NamedTensors trainable = engine::LoraNamedParameters(*model);
  auto on_device = torch::TensorOptions().device(model->device());
  torch::manual_seed(3);
  const torch::Tensor before = torch::rand({4}, on_device);
  torch::manual_seed(3);
  auto choice = engine::FindMicroBatchSize(*model, train, trainable);
  ASSERT_TRUE(choice.ok()) << choice.status().message();
  EXPECT_TRUE(torch::equal(torch::rand({4}, on_device), before));
  if (!model->device().is_cuda()) {
    EXPECT_EQ(choice->micro_batch_size, 1);
  } else {
    EXPECT_EQ(choice->micro_batch_size, 2) << choice->explanation;  // the training set's size caps it
  }
  EXPECT_FALSE(choice->explanation.empty());
  for (const auto& [name, t] : trainable) EXPECT_FALSE(t.grad().defined()) << name;
}

}  // namespace
}  // namespace trainerd::testing
