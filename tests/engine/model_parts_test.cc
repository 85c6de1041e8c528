// The model's parts on their own: attention paths agree, PEFT's LoRA
// initialisation, how many steps a job runs, and how evaluation batches.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include "engine/llama_model.h"
#include "engine/lora.h"
#include "engine/tensor_io.h"
#include "engine/trainer.h"
#include "tests/engine/test_support.h"

namespace trainerd::testing {
namespace {

// On LibTorch 2.x CausalAttention is SDPA; on 1.13 both are the explicit path.
TEST(Attention, SdpaMatchesExplicitWithGroupedHeads) {
  torch::manual_seed(0);
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  torch::Tensor q = torch::randn({2, 8, 13, 16}, opts);
  torch::Tensor k = torch::randn({2, 2, 13, 16}, opts);
  torch::Tensor v = torch::randn({2, 2, 13, 16}, opts);
  torch::Tensor a = engine::CausalAttention(q, k, v);
  torch::Tensor b = engine::CausalAttentionExplicit(q, k, v);
  ASSERT_EQ(a.sizes(), b.sizes());
  EXPECT_LE(Report("sdpa vs explicit attention rel err", RelativeError(a, b)), 1e-5);
  // Causality: changing the last position's keys and values leaves earlier outputs alone.
  torch::Tensor k2 = k.clone(), v2 = v.clone();
  k2.select(2, 12).fill_(3.0);
  v2.select(2, 12).fill_(-3.0);
  torch::Tensor c = engine::CausalAttention(q, k2, v2);
  EXPECT_TRUE(torch::allclose(c.narrow(2, 0, 12), a.narrow(2, 0, 12)));
  EXPECT_FALSE(torch::allclose(c.narrow(2, 12, 1), a.narrow(2, 12, 1)));
}

TEST(Attention, PackedMaskMatchesExplicitAndKeepsExamplesApart) {
  torch::manual_seed(1);
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(TorchTestDevice());
  torch::Tensor q = torch::randn({1, 4, 7, 8}, opts), k = torch::randn({1, 2, 7, 8}, opts);
  torch::Tensor v = torch::randn({1, 2, 7, 8}, opts);
  // Two packed examples of lengths 4 and 3.
  torch::Tensor positions = torch::tensor({0, 1, 2, 3, 0, 1, 2}, torch::kInt64).view({1, 7}).to(q.device());
  torch::Tensor mask = engine::PackedAttentionMask(positions);
  torch::Tensor a = engine::CausalAttention(q, k, v, mask);
  EXPECT_LE(RelativeError(a, engine::CausalAttentionExplicit(q, k, v, mask)), 1e-5);
  // The second example alone gives the same outputs as inside the pack.
  torch::Tensor alone = engine::CausalAttention(q.narrow(2, 4, 3), k.narrow(2, 4, 3), v.narrow(2, 4, 3));
  EXPECT_LE(RelativeError(a.narrow(2, 4, 3), alone), 1e-5);
}

// The llama fixture in float32 on the CPU.
std::unique_ptr<engine::LlamaModel> FixtureModel() {
  auto config = engine::LoadModelConfig(Fixture("llama/model"));
  EXPECT_TRUE(config.ok());
  auto weights = engine::LoadModelWeights(Fixture("llama/model"), torch::kFloat32, torch::kCPU);
  EXPECT_TRUE(weights.ok());
  auto model = engine::LlamaModel::FromWeights(*config, std::move(*weights), "fixture");
  EXPECT_TRUE(model.ok());
  return model.ok() ? std::move(*model) : nullptr;
}

TEST(LoraInit, FollowsPeftDefaults) {
  auto model = FixtureModel();
  ASSERT_TRUE(model);
  engine::LoraSettings s;
  s.r = 8;
  s.alpha = 16;
  s.target_modules = {"q_proj", "down_proj"};
  engine::AttachLora(*model, s);
  auto params = engine::LoraNamedParameters(*model);
  ASSERT_EQ(params.size(), 2u * 2u * 2u);  // 2 layers x 2 modules x (A, B)
  for (const auto& [name, t] : params) {
    EXPECT_EQ(t.scalar_type(), torch::kFloat32) << name;
    EXPECT_TRUE(t.requires_grad()) << name;
    if (name.find("lora_B") != std::string::npos) {
      EXPECT_EQ(t.abs().max().item<float>(), 0.0f) << name;
    } else {
      // kaiming_uniform(a=sqrt(5)): U(-1/sqrt(in), 1/sqrt(in)), std 1/sqrt(3 in).
      const double in = static_cast<double>(t.size(1));
      EXPECT_LE(t.abs().max().item<double>(), 1.0 / std::sqrt(in) + 1e-7) << name;
      EXPECT_NEAR(t.std().item<double>(), 1.0 / std::sqrt(3 * in), 0.25 / std::sqrt(3 * in)) << name;
    }
  }
  EXPECT_EQ(params[0].first, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_DOUBLE_EQ(s.scaling(), 2.0);
  s.use_rslora = true;
  EXPECT_DOUBLE_EQ(s.scaling(), 16.0 / std::sqrt(8.0));
}

// The groups' first-module numbers (LoRA dropout's mask numbers within a
// layer) are where each group's members stand in Modules()' order.
TEST(DecoderLayer, GroupsStartWhereTheirModulesStand) {
  const engine::DecoderLayer layer;
  const auto modules = layer.Modules();
  const std::pair<engine::GroupMembers, int64_t> groups[] = {
      {layer.QkvGroup(), engine::DecoderLayer::kQkvFirst},
      {layer.OGroup(), engine::DecoderLayer::kOFirst},
      {layer.GateUpGroup(), engine::DecoderLayer::kGateUpFirst},
      {layer.DownGroup(), engine::DecoderLayer::kDownFirst}};
  size_t covered = 0;
  for (const auto& [group, first] : groups) {
    for (size_t i = 0; i < group.members.size(); ++i) {
      EXPECT_EQ(group.members[i], modules[static_cast<size_t>(first) + i]) << "module " << first + int64_t(i);
    }
    covered += group.members.size();
  }
  EXPECT_EQ(covered, modules.size());
}

TEST(TotalSteps, FromEpochsOrMaxSteps) {
  JobSpec::Training t;
  t.micro_batch_size = 4;
  t.gradient_accumulation_steps = 2;
  t.epochs = 1;
  EXPECT_EQ(engine::TotalSteps(t, 16), 2);
  EXPECT_EQ(engine::TotalSteps(t, 17), 3);  // a partial last step still runs
  t.epochs = 2.5;
  EXPECT_EQ(engine::TotalSteps(t, 16), 5);
  t.max_steps = 7;
  EXPECT_EQ(engine::TotalSteps(t, 16), 7);
}

engine::TokenDataset DatasetOfLengths(const std::vector<int64_t>& lengths) {
  engine::TokenDataset data;
  for (int64_t n : lengths) {
    engine::TokenExample e;
    e.input_ids.assign(static_cast<size_t>(n), n);
    e.labels = e.input_ids;
    data.examples.push_back(e);
  }
  return data;
}

TEST(EvaluationBatches, LongestFirstEveryExampleOnce) {
  const engine::TokenDataset data = DatasetOfLengths({3, 10, 5, 7, 1, 5, 9});
  const auto batches = engine::EvaluationBatches(data, 3);
  // The first batch: 3 examples of at most 10 tokens, 30 padded; the rest, at
  // most 5 tokens long, fit 30 in one batch of four.
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].size(), 3u);
  EXPECT_EQ(batches[1].size(), 4u);
  std::vector<const engine::TokenExample*> seen;
  std::vector<size_t> lengths;
  for (const auto& batch : batches) {
    for (const engine::TokenExample* e : batch) {
      seen.push_back(e);
      lengths.push_back(e->input_ids.size());
    }
  }
  EXPECT_EQ(lengths, (std::vector<size_t>{10, 9, 7, 5, 5, 3, 1}));
  // Ties keep file order: the first 5 (index 2) before the second (index 5).
  EXPECT_EQ(seen[3], &data.examples[2]);
  EXPECT_EQ(seen[4], &data.examples[5]);
  EXPECT_TRUE(engine::EvaluationBatches(engine::TokenDataset{}, 4).empty());
}

// Short examples after a long one go many to a batch, within the first
// batch's padded tokens (2 x 100), and every batch pads to its first row.
TEST(EvaluationBatches, LaterBatchesFillTheFirstBatchsTokens) {
  std::vector<int64_t> lengths = {100};
  for (int i = 0; i < 50; ++i) lengths.push_back(10);
  lengths.push_back(0);  // an empty example still takes a row
  lengths.push_back(60);
  const engine::TokenDataset data = DatasetOfLengths(lengths);
  const auto batches = engine::EvaluationBatches(data, 2);
  std::vector<size_t> sizes;
  size_t examples = 0;
  for (const auto& batch : batches) {
    sizes.push_back(batch.size());
    examples += batch.size();
    EXPECT_LE(batch.size() * std::max<size_t>(1, batch.front()->input_ids.size()), 200u);
  }
  // {100, 60}, then 20, 20 and 10 tens, then the empty one beside them.
  EXPECT_EQ(sizes, (std::vector<size_t>{2, 20, 20, 11}));
  EXPECT_EQ(examples, data.examples.size());
  EXPECT_EQ(batches.back().back()->input_ids.size(), 0u);
}

// With the training's row length given (the trainer passes its longest
// example), batches hold what a training micro-batch holds in tokens: eval
// rows longer than the budget's share go alone or fewer to a batch, shorter
// ones more.
TEST(EvaluationBatches, WithinTheTrainingMicroBatchsTokens) {
  std::vector<int64_t> lengths = {40, 30};
  for (int i = 0; i < 20; ++i) lengths.push_back(10);
  const auto batches = engine::EvaluationBatches(DatasetOfLengths(lengths), 2, 20);  // 40 tokens a batch
  std::vector<size_t> sizes;
  for (const auto& batch : batches) sizes.push_back(batch.size());
  EXPECT_EQ(sizes, (std::vector<size_t>{1, 1, 4, 4, 4, 4, 4}));
  // Training rows longer than the eval set's: its one batch of 8 (80 tokens allowed).
  EXPECT_EQ(engine::EvaluationBatches(DatasetOfLengths(std::vector<int64_t>(8, 10)), 2, 40).size(), 1u);
}

// One-token examples after a long one: rows capped at kMaxEvaluationRows,
// not the 4 x 4096 the tokens would allow.
TEST(EvaluationBatches, RowsCapped) {
  std::vector<int64_t> lengths = {4096};
  for (size_t i = 0; i < 3 * engine::kMaxEvaluationRows; ++i) lengths.push_back(1);
  const auto batches = engine::EvaluationBatches(DatasetOfLengths(lengths), 4);
  ASSERT_EQ(batches.size(), 4u);
  EXPECT_EQ(batches[0].size(), 4u);
  EXPECT_EQ(batches[1].size(), engine::kMaxEvaluationRows);
  EXPECT_EQ(batches[2].size(), engine::kMaxEvaluationRows);
  EXPECT_EQ(batches[3].size(), engine::kMaxEvaluationRows - 3);
}

// Batching is a matter of speed only: the fixture's ragged eval set gives the
// same loss and target count in batches of one longest example's tokens as of
// four (sorted and padded).
TEST(Evaluate, SameLossWhateverTheBatchSize) {
  auto model = FixtureModel();
  ASSERT_TRUE(model);
  auto data = engine::LoadTokenDataset(Fixture("llama/eval.jsonl"), model->config().vocab_size, 64);
  ASSERT_TRUE(data.ok()) << data.status().message();
  // The two batchings differ (else the test shows nothing).
  ASSERT_NE(engine::EvaluationBatches(*data, 1).size(), engine::EvaluationBatches(*data, 4).size());
  const engine::EvalResult one = engine::Evaluate(*model, *data, 1);
  const engine::EvalResult four = engine::Evaluate(*model, *data, 4);
  EXPECT_GT(one.tokens, 0);
  EXPECT_EQ(one.tokens, four.tokens);
  EXPECT_NEAR(one.loss, four.loss, 1e-5 * one.loss);
}

// A batch of many padded rows (the 256-row cap: rows of 2-3 tokens, where the
// first batch's 4 x 240 tokens would allow 320) gives each example's loss as
// if it ran alone: the token-weighted mean of 301 one-example evaluations.
TEST(Evaluate, ManyRowBatchesMatchExamplesAlone) {
  auto model = FixtureModel();
  ASSERT_TRUE(model);
  std::mt19937 rng(7);
  engine::TokenDataset data;
  for (int i = 0; i < 301; ++i) {
    engine::TokenExample e;
    const size_t n = i == 0 ? 240 : 2 + rng() % 2;
    for (size_t j = 0; j < n; ++j) e.input_ids.push_back(static_cast<int64_t>(rng() % 256));
    e.labels = e.input_ids;
    if (i % 3 == 0) e.labels[1] = -100;  // some examples mask a target
    data.examples.push_back(e);
  }
  const auto batches = engine::EvaluationBatches(data, 4);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[1].size(), engine::kMaxEvaluationRows);
  const engine::EvalResult together = engine::Evaluate(*model, data, 4);
  double sum = 0;
  int64_t tokens = 0;
  for (const engine::TokenExample& e : data.examples) {
    engine::TokenDataset one;
    one.examples.push_back(e);
    const engine::EvalResult alone = engine::Evaluate(*model, one, 1);
    sum += alone.loss * static_cast<double>(alone.tokens);
    tokens += alone.tokens;
  }
  EXPECT_EQ(together.tokens, tokens);
  EXPECT_NEAR(together.loss, sum / static_cast<double>(tokens), 1e-5 * together.loss);
}

// tokens/s and MFU are training figures: a run that evaluates a large set
// after every step reports about the tokens/s of the same run without
// evaluation (evaluation here takes tens of times a step, so counting it
// would divide the figure by about that much).
TEST(Progress, TokensPerSecondLeavesOutEvaluation) {
  TempDir tmp;
  const std::string eval = tmp / "eval.jsonl";
  {
    std::ofstream out(eval);
    std::mt19937 rng(3);
    for (int i = 0; i < 96; ++i) {
      out << "{\"input_ids\": [";
      for (int j = 0; j < 128; ++j) out << (j ? ", " : "") << rng() % 256;
      out << "]}\n";
    }
  }
  auto job = [&](const std::string& out, bool with_eval) {
    return "model:\n  path: " + Fixture("llama/model") + "\n  dtype: float32\nadapter:\n  r: 2\n"
           "data:\n  train: " + Fixture("llama/lora_train/train.jsonl") + (with_eval ? "\n  eval: " + eval : "") +
           "\ntraining:\n  max_steps: 7\n  micro_batch_size: 1\n  log_every: 1\n" +
           (with_eval ? "  eval_every: 1\n" : "") + "output:\n  dir: " + out + "\ndevice: cpu\n";
  };
  auto median_tokens_per_s = [&](const std::string& yaml) {
    RecordingReporter r;
    auto result = engine::RunJob(SpecFromYaml(yaml, tmp.path()), {}, r);
    EXPECT_TRUE(result.ok()) << result.status().message();
    std::vector<double> rates;  // the first window also times the start
    for (size_t i = 1; i < r.progress.size(); ++i) rates.push_back(r.progress[i].tokens_per_s);
    EXPECT_EQ(rates.size(), 6u);
    std::sort(rates.begin(), rates.end());
    return std::make_pair(rates.empty() ? 0.0 : rates[rates.size() / 2], r.evals.size());
  };
  const auto [plain, no_evals] = median_tokens_per_s(job(tmp / "plain", false));
  const auto [evaluated, evals] = median_tokens_per_s(job(tmp / "evaluated", true));
  EXPECT_EQ(no_evals, 0u);
  EXPECT_EQ(evals, 7u);
  ASSERT_GT(plain, 0);
  EXPECT_GT(evaluated, plain / 3) << "tokens/s " << evaluated << " with evaluation, " << plain << " without";
}

std::string ShuffledJob(const std::string& out, int seed, bool shuffle) {
  return "model:\n  path: " + Fixture("llama/model") + "\n  dtype: float32\nadapter:\n  r: 2\n"
         "data:\n  train: " + Fixture("llama/lora_train/train.jsonl") + "\n  shuffle: " + (shuffle ? "true" : "false") +
         "\ntraining:\n  max_steps: 5\n  micro_batch_size: 2\n  seed: " + std::to_string(seed) +
         "\noutput:\n  dir: " + out + "\ndevice: cpu\n";
}

std::vector<double> RunLosses(const std::string& yaml, const std::string& dir) {
  RecordingReporter r;
  auto result = engine::RunJob(SpecFromYaml(yaml, dir), {}, r);
  EXPECT_TRUE(result.ok()) << result.status().message();
  std::vector<double> out;
  for (const auto& e : r.progress) out.push_back(e.loss);
  return out;
}

TEST(Shuffle, SeededAndReproducible) {
  TempDir tmp;
  const auto a = RunLosses(ShuffledJob(tmp / "a", 1, true), tmp.path());
  const auto b = RunLosses(ShuffledJob(tmp / "b", 1, true), tmp.path());
  const auto c = RunLosses(ShuffledJob(tmp / "c", 2, true), tmp.path());
  const auto d = RunLosses(ShuffledJob(tmp / "d", 1, false), tmp.path());
  EXPECT_EQ(a, b);  // same seed, same order, same numbers
  EXPECT_NE(a, c);  // another seed, another order
  EXPECT_NE(a, d);  // file order differs from the shuffled one
}

}  // namespace
}  // namespace trainerd::testing
