// CUDA graphs of the training step (engine/step_graph.h): which jobs' micro-
// batches run as graphs and the shapes their batches take, and, on CUDA
// (TRAINERD_TEST_DEVICE=cuda), that a job replaying graphs trains exactly as
// the same job launching kernel by kernel: the same losses step by step (each
// step with other examples and another target count, so stale inputs or a
// stale count would show) and the same adapter (so would LoRA copies the
// graphs failed to refresh, or gradients a graph failed to add).
#include <algorithm>
#include <cstdio>
#include <fstream>

#include "engine/step_graph.h"
#include "engine/tensor_io.h"
#include "tests/engine/test_support.h"

namespace trainerd::testing {
namespace {

// An example of `length` tokens; packed: examples of `each` tokens back to back.
engine::TokenExample Example(size_t length, size_t each = 0) {
  engine::TokenExample ex;
  for (size_t i = 0; i < length; ++i) {
    ex.input_ids.push_back(static_cast<int64_t>(3 + i));
    ex.labels.push_back(static_cast<int64_t>(3 + i));
    if (each > 0) ex.position_ids.push_back(static_cast<int64_t>(i % each));
  }
  return ex;
}

TEST(PlanStepGraph, NamesWhatKeepsStepsFromGraphs) {
  engine::TokenDataset data;
  for (size_t length : {8, 5, 40, 33}) data.examples.push_back(Example(length));
  const engine::StepGraphPlan plain = engine::PlanStepGraph(data, 2);
  EXPECT_EQ(plain.obstacle, "");  // examples of different lengths: a graph per width
  EXPECT_EQ(plain.longest, 40);
  EXPECT_EQ(plain.segments, 0);

  engine::TokenDataset both = data;
  both.examples.push_back(Example(8, 4));
  EXPECT_NE(engine::PlanStepGraph(both, 2).obstacle.find("mixed"), std::string::npos);
}

TEST(PlanStepGraph, RoundsWidthsUpToFewShapes) {
  engine::TokenDataset data;
  for (size_t length : {8, 5, 40, 33, 17}) data.examples.push_back(Example(length));
  const engine::StepGraphPlan plan = engine::PlanStepGraph(data, 2);
  const auto& ex = data.examples;
  auto width = [&](std::vector<const engine::TokenExample*> rows) { return plan.ShapeOf(rows).width; };
  EXPECT_EQ(width({&ex[0], &ex[1]}), engine::kGraphWidthMultiple);  // 8 and 5 tokens: one multiple
  EXPECT_EQ(width({&ex[4]}), 2 * engine::kGraphWidthMultiple);      // 17: the next
  EXPECT_EQ(width({&ex[3], &ex[0]}), 40);                           // 33 rounds to 48: capped at the longest
  EXPECT_EQ(width({&ex[2]}), 40);
  EXPECT_EQ(plan.ShapeOf({&ex[1]}).segments, 0);

  // Longer examples: a coarser multiple, so that there are at most 128 widths.
  engine::TokenDataset long_data;
  for (size_t length : {100, 2049, 8190}) long_data.examples.push_back(Example(length));
  const engine::StepGraphPlan long_plan = engine::PlanStepGraph(long_data, 1);
  EXPECT_EQ(long_plan.width_multiple, 4 * engine::kGraphWidthMultiple);  // 64 for 8,190 tokens
  EXPECT_EQ(long_plan.ShapeOf({&long_data.examples[0]}).width, 128);
  EXPECT_EQ(long_plan.ShapeOf({&long_data.examples[1]}).width, 2112);
  EXPECT_EQ(long_plan.ShapeOf({&long_data.examples[2]}).width, 8190);

  // Packed rows of 20 tokens (5 examples of 4) and 19 (7 examples of 3, the
  // last one cut short): segments for the most examples in a row, plus a
  // row's padding, in each of 3 rows.
  engine::TokenDataset packed;
  packed.examples = {Example(20, 4), Example(19, 3), Example(20, 4)};
  const engine::StepGraphPlan rows = engine::PlanStepGraph(packed, 3);
  EXPECT_EQ(rows.obstacle, "");
  const engine::BatchShape shape = rows.ShapeOf({&packed.examples[1]});
  EXPECT_EQ(shape.width, 20);  // 19 rounds to 32: capped at the longest row
  EXPECT_EQ(shape.segments, 3 * (7 + 1));
}

TEST(PlanStepGraph, BatchesOfThePlannedShapeAreAlike) {
  const engine::TokenExample a = Example(20, 4), b = Example(13, 13), c = Example(19, 3);
  const engine::BatchShape shape{20, 2 * (7 + 1)};
  const engine::Batch first = engine::MakeBatch({&a, &b}, torch::kCPU, shape);
  const engine::Batch second = engine::MakeBatch({&c, &b}, torch::kCPU, shape);
  EXPECT_EQ(first.input_ids.sizes(), (std::vector<int64_t>{2, 20}));
  EXPECT_EQ(second.input_ids.sizes(), first.input_ids.sizes());
  EXPECT_EQ(first.input_tokens, 33);  // padding does not count
  // The segments (made on CUDA by MakeBatch; here from the positions): the batch's own, then empty ones.
  const engine::PackedSegments s = engine::PackedSegmentsFromPositions(first.position_ids, torch::kCPU, shape.segments);
  EXPECT_EQ(s.max_len, 20);
  ASSERT_EQ(s.cu_seqlens.numel(), shape.segments + 1);
  const std::vector<int32_t> expected{0, 4, 8, 12, 16, 20, 33};  // 5 examples, b, then b's padding run
  for (int64_t i = 0; i < s.cu_seqlens.numel(); ++i) {
    EXPECT_EQ(s.cu_seqlens[i].item<int32_t>(), i < 7 ? expected[i] : 40) << i;
  }
  EXPECT_THROW(engine::PackedSegmentsFromPositions(first.position_ids, torch::kCPU, 6), c10::Error);
}

TEST(StepGraph, NotSupportedOnTheCpu) { EXPECT_FALSE(engine::StepGraph::Supported(torch::Device(torch::kCPU))); }

// The job's variants: unpacked examples of one length, of several lengths,
// or packed ones.
enum class Data { kUnpacked, kVariable, kPacked };

// kVariable's micro-batches, in order (shuffle off), by the width their rows
// round up to (kGraphWidthMultiple 16; the longest example has 40 tokens):
// 16 and 40 in steps 1-4, then 16 and 32 (a width first seen after the first
// graphs were recorded), 32 and 40, 16 and 32. Each micro-batch's two rows.
const std::vector<std::vector<int>> kVariableRows = {{10, 16}, {35, 40}, {12, 9},  {40, 33}, {16, 7},
                                                     {38, 36}, {14, 11}, {34, 40}, {6, 15},  {20, 30},
                                                     {25, 32}, {39, 40}, {13, 8},  {17, 28}};

// Examples with a pattern the model can learn (so the loss moves from step to
// step) and prompts of varying length masked out of the labels (so each step
// has its own target count). Unpacked: 16 examples of 24 tokens. Variable:
// kVariableRows' 28. Packed: 32 of 12 and 20 tokens in turn, four to a row of
// 64 (segments to pad: capacity 2 * (4 + 1) a micro-batch, 8 used).
std::string WriteTokens(const std::string& dir, Data data) {
  const std::string path = dir + "/tokens.jsonl";
  std::ofstream out(path);
  std::vector<int> lengths;
  for (const auto& rows : kVariableRows) lengths.insert(lengths.end(), rows.begin(), rows.end());
  const int count = data == Data::kPacked ? 32 : data == Data::kVariable ? static_cast<int>(lengths.size()) : 16;
  for (int e = 0; e < count; ++e) {
    std::string ids, labels;
    const int length = data == Data::kPacked ? (e % 2 ? 20 : 12) : data == Data::kVariable ? lengths[e] : 24;
    const int prompt = std::min(2 + (e * 5) % 9, length - 3);  // at least two targets
    for (int i = 0; i < length; ++i) {
      // Variable: one pattern for all (each example is seen once).
      const int id = 10 + (data == Data::kVariable ? i * 7 + e % 2 : e * 7 + i * (1 + e % 3)) % 200;
      ids += (i ? ", " : "") + std::to_string(id);
      labels += (i ? ", " : "") + std::to_string(i < prompt ? -100 : id);
    }
    out << "{\"input_ids\": [" << ids << "], \"labels\": [" << labels << "]}\n";
  }
  return path;
}

std::string GraphJob(const std::string& tokens, const std::string& out, bool graphs, bool checkpointing, Data data,
                     const std::string& dropout) {
  const bool packed = data == Data::kPacked;
  return "model:\n  path: " + Fixture("llama/model") + "\n  dtype: " + TestDtype() +
         "\nadapter:\n  r: 4\n  alpha: 8\n  dropout: " + dropout + "\n  target_modules: all-linear\n"
         "data:\n  train: " + tokens + "\n  format: tokens\n  cache: false\n  shuffle: " +
         (data == Data::kVariable ? "false\n  max_seq_len: 48\n" : packed ? "true\n  max_seq_len: 64\n  packing: true\n"
                                                                    : "true\n  max_seq_len: 24\n") +
         "training:\n  max_steps: 7\n  micro_batch_size: 2\n  gradient_accumulation_steps: 2\n"
         "  learning_rate: 0.02\n  lr_scheduler: cosine\n  warmup_steps: 1\n  weight_decay: 0.01\n"
         "  max_grad_norm: 1.0\n  log_every: 1\n  seed: 11\n  cuda_graphs: " + (graphs ? "true" : "false") +
         (checkpointing ? "\n  gradient_checkpointing: true" : "") +
         "\noutput:\n  dir: " + out + "\ndevice: " + TestDevice() + "\n";
}

bool Recorded(const RecordingReporter& r) {
  for (const std::string& m : r.messages) {
    if (m.find("recorded the run's first CUDA graph") != std::string::npos) return true;
  }
  return false;
}

bool HasMessage(const RecordingReporter& r, const std::string& text) {
  for (const std::string& m : r.messages) {
    if (m == text) return true;
  }
  return false;
}

// `graph_runs` of the run's 14 micro-batches ran a graph, of `graphs`. With
// LoRA dropout (`dropout`, as the YAML writes it) every replay must draw the
// masks the kernel-by-kernel step draws. Returns the kernel-by-kernel losses.
std::vector<double> ExpectGraphTrainsAsEager(bool checkpointing, Data data, const std::string& graph_runs,
                                             const std::string& dropout = "0.0") {
  TempDir tmp;
  const std::string tokens = WriteTokens(tmp.path(), data);
  RecordingReporter eager, graphed;
  const JobSpec eager_spec =
      SpecFromYaml(GraphJob(tokens, tmp / "eager", false, checkpointing, data, dropout), tmp.path());
  const JobSpec graph_spec =
      SpecFromYaml(GraphJob(tokens, tmp / "graph", true, checkpointing, data, dropout), tmp.path());
  auto a = engine::RunJob(eager_spec, {}, eager);
  EXPECT_TRUE(a.ok()) << a.status().message();
  auto b = engine::RunJob(graph_spec, {}, graphed);
  EXPECT_TRUE(b.ok()) << b.status().message();
  if (!a.ok() || !b.ok()) return {};
  // Where graphs run, they did; elsewhere the option changes nothing.
  EXPECT_EQ(Recorded(graphed), engine::StepGraph::Supported(TorchTestDevice()));
  EXPECT_FALSE(Recorded(eager));
  // Every micro-batch after the eager ones ran a graph (none fell back to
  // launching kernel by kernel), and a shape's first ran eagerly.
  if (engine::StepGraph::Supported(TorchTestDevice())) {
    EXPECT_TRUE(HasMessage(graphed, "CUDA graphs ran " + graph_runs + ", one per micro-batch shape)"));
  }

  EXPECT_EQ(eager.progress.size(), 7u);
  EXPECT_EQ(graphed.progress.size(), 7u);
  if (eager.progress.size() != 7u || graphed.progress.size() != 7u) return {};
  std::vector<double> losses;
  for (const auto& p : eager.progress) losses.push_back(p.loss);
  const double tol = TestTolerances().loss;
  double spread = 0;
  for (size_t i = 0; i < eager.progress.size(); ++i) {
    const double x = eager.progress[i].loss, y = graphed.progress[i].loss;
    EXPECT_LE(std::abs(x - y), tol * std::abs(x)) << "step " << i + 1 << ": " << x << " against " << y;
    spread = std::max(spread, std::abs(x - eager.progress[0].loss));
  }
  // The comparison can fail: the steps' losses differ by far more than the tolerance.
  EXPECT_GT(spread, 5 * tol * std::abs(eager.progress[0].loss));
  Report("losses' spread over the steps", spread);

  auto x = engine::ReadSafetensors(tmp / "eager/adapter/adapter_model.safetensors");
  auto y = engine::ReadSafetensors(tmp / "graph/adapter/adapter_model.safetensors");
  EXPECT_TRUE(x.ok() && y.ok());
  if (!x.ok() || !y.ok()) return losses;
  EXPECT_EQ(x->size(), y->size());
  for (const auto& [name, t] : *x) {
    EXPECT_TRUE(y->count(name)) << name;
    if (y->count(name)) {
      EXPECT_LE(RelativeError(y->at(name), t), TestTolerances().logits) << name;
    }
  }
  return losses;
}

// Steps 1-2 run kernel by kernel (4 micro-batches); the third step's first
// micro-batch is recorded, and every later one replays the graph.
const char kOneShape[] = "10 of this run's 14 micro-batches (1 graph";

TEST(StepGraph, TrainsAsTheKernelByKernelStep) { ExpectGraphTrainsAsEager(false, Data::kUnpacked, kOneShape); }

TEST(StepGraph, TrainsAsTheKernelByKernelStepWithCheckpointing) {
  ExpectGraphTrainsAsEager(true, Data::kUnpacked, kOneShape);
}

// Examples of several lengths: widths 16 and 40 recorded in step 3; width 32
// first seen in step 5 (kernel by kernel, its memory from the graphs' pool),
// recorded in step 6. The kernel-by-kernel job pads each batch to its own
// longest row only.
TEST(StepGraph, TrainsAsTheKernelByKernelStepOnExamplesOfSeveralLengths) {
  ExpectGraphTrainsAsEager(false, Data::kVariable, "9 of this run's 14 micro-batches (3 graphs");
}

// LoRA dropout: each replay draws new masks from the generator's graph-safe
// state, the ones the kernel-by-kernel step draws, so the steps agree; and
// the masks applied (the losses are not those without dropout). With
// checkpointing, the recomputed layers make the same masks inside the graph.
TEST(StepGraph, TrainsAsTheKernelByKernelStepWithLoraDropout) {
  const std::vector<double> plain = ExpectGraphTrainsAsEager(false, Data::kUnpacked, kOneShape);
  const std::vector<double> dropped = ExpectGraphTrainsAsEager(false, Data::kUnpacked, kOneShape, "0.3");
  const std::vector<double> recomputed = ExpectGraphTrainsAsEager(true, Data::kUnpacked, kOneShape, "0.3");
  ASSERT_EQ(plain.size(), 7u);
  ASSERT_EQ(dropped.size(), 7u);
  ASSERT_EQ(recomputed.size(), 7u);
  // Step 1's loss is the base model's (B starts at zero); later ones differ,
  // by more than rounding (measured at step 7: 1.4% in bfloat16 on CUDA).
  EXPECT_GT(std::abs(dropped[6] - plain[6]), 0.005 * std::abs(plain[6]));
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_LE(std::abs(recomputed[i] - dropped[i]), TestTolerances().loss * std::abs(dropped[i])) << "step " << i + 1;
  }
}

// Packed rows: the graph's batches carry padded segments (empty ones at the
// end) that the kernel-by-kernel job's do not.
TEST(StepGraph, TrainsAsTheKernelByKernelStepOnPackedRows) {
  ExpectGraphTrainsAsEager(false, Data::kPacked, kOneShape);
}

}  // namespace
}  // namespace trainerd::testing
