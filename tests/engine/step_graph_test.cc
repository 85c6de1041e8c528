// CUDA graphs of the training step (engine/step_graph.h): when a job's steps
// qualify, and, on CUDA (TRAINERD_TEST_DEVICE=cuda), that a job replaying its
// step as a graph trains exactly as the same job launching kernel by kernel:
// the same losses step by step (each step with other examples and another
// target count, so stale inputs or a stale count would show) and the same
// adapter (so would LoRA copies the graph failed to refresh).
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

TEST(PlanStepGraph, NamesWhatKeepsStepsFromOneGraph) {
  engine::TokenDataset same;
  for (int i = 0; i < 3; ++i) same.examples.push_back(Example(8));
  const engine::StepGraphPlan plain = engine::PlanStepGraph(same, false, 2);
  EXPECT_EQ(plain.obstacle, "");
  EXPECT_EQ(plain.shape.width, 0);  // the batches are alike as they are
  EXPECT_EQ(plain.shape.segments, 0);

  engine::TokenDataset mixed = same;
  mixed.examples.push_back(Example(5));
  const std::string widths = engine::PlanStepGraph(mixed, false, 2).obstacle;
  EXPECT_NE(widths.find("differ in length (from 5 to 8 tokens)"), std::string::npos) << widths;

  engine::TokenDataset both = same;
  both.examples.push_back(Example(8, 4));
  EXPECT_NE(engine::PlanStepGraph(both, false, 2).obstacle.find("mixed"), std::string::npos);

  EXPECT_NE(engine::PlanStepGraph(same, true, 2).obstacle.find("LoRA dropout"), std::string::npos);
}

TEST(PlanStepGraph, PadsPackedRowsToOneShape) {
  // Rows of 20 tokens (5 examples of 4) and 19 (7 examples of 3, the last one cut short).
  engine::TokenDataset packed;
  packed.examples = {Example(20, 4), Example(19, 3), Example(20, 4)};
  const engine::StepGraphPlan plan = engine::PlanStepGraph(packed, false, 3);
  EXPECT_EQ(plan.obstacle, "");
  EXPECT_EQ(plan.shape.width, 20);
  EXPECT_EQ(plan.shape.segments, 3 * (7 + 1));  // the most examples in a row, plus a row's padding

  // Rows of 10 padded to 20 tokens: a fifth of the tokens would be padding.
  packed.examples.push_back(Example(10, 5));
  packed.examples.push_back(Example(10, 5));
  const std::string obstacle = engine::PlanStepGraph(packed, false, 3).obstacle;
  EXPECT_NE(obstacle.find("would add 21% padding"), std::string::npos) << obstacle;
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

// The job's variants: unpacked examples of one length, or packed ones.
enum class Data { kUnpacked, kPacked };

// Examples with a pattern the model can learn (so the loss moves from step to
// step) and prompts of varying length masked out of the labels (so each step
// has its own target count). Unpacked: 16 examples of 24 tokens. Packed: 32
// of 12 and 20 tokens in turn, four to a row of 64 (no padding to plan for,
// but segments to pad: capacity 2 * (4 + 1) a micro-batch, 8 used).
std::string WriteTokens(const std::string& dir, Data data) {
  const std::string path = dir + "/tokens.jsonl";
  std::ofstream out(path);
  const int count = data == Data::kPacked ? 32 : 16;
  for (int e = 0; e < count; ++e) {
    std::string ids, labels;
    const int length = data == Data::kPacked ? (e % 2 ? 20 : 12) : 24;
    const int prompt = 2 + (e * 5) % 9;
    for (int i = 0; i < length; ++i) {
      const int id = 10 + (e * 7 + i * (1 + e % 3)) % 200;
      ids += (i ? ", " : "") + std::to_string(id);
      labels += (i ? ", " : "") + std::to_string(i < prompt ? -100 : id);
    }
    out << "{\"input_ids\": [" << ids << "], \"labels\": [" << labels << "]}\n";
  }
  return path;
}

std::string GraphJob(const std::string& tokens, const std::string& out, bool graphs, bool checkpointing, Data data) {
  const bool packed = data == Data::kPacked;
  return "model:\n  path: " + Fixture("llama/model") + "\n  dtype: " + TestDtype() +
         "\nadapter:\n  r: 4\n  alpha: 8\n  dropout: 0.0\n  target_modules: all-linear\n"
         "data:\n  train: " + tokens + "\n  format: tokens\n  shuffle: true\n  cache: false\n  max_seq_len: " +
         (packed ? "64\n  packing: true\n" : "24\n") +
         "training:\n  max_steps: 7\n  micro_batch_size: 2\n  gradient_accumulation_steps: 2\n"
         "  learning_rate: 0.02\n  lr_scheduler: cosine\n  warmup_steps: 1\n  weight_decay: 0.01\n"
         "  max_grad_norm: 1.0\n  log_every: 1\n  seed: 11\n  cuda_graphs: " + (graphs ? "true" : "false") +
         (checkpointing ? "\n  gradient_checkpointing: true" : "") +
         "\noutput:\n  dir: " + out + "\ndevice: " + TestDevice() + "\n";
}

bool Recorded(const RecordingReporter& r) {
  for (const std::string& m : r.messages) {
    if (m.find("recorded as a CUDA graph") != std::string::npos) return true;
  }
  return false;
}

bool HasMessage(const RecordingReporter& r, const std::string& text) {
  for (const std::string& m : r.messages) {
    if (m == text) return true;
  }
  return false;
}

void ExpectGraphTrainsAsEager(bool checkpointing, Data data = Data::kUnpacked) {
  TempDir tmp;
  const std::string tokens = WriteTokens(tmp.path(), data);
  RecordingReporter eager, graphed;
  const JobSpec eager_spec = SpecFromYaml(GraphJob(tokens, tmp / "eager", false, checkpointing, data), tmp.path());
  const JobSpec graph_spec = SpecFromYaml(GraphJob(tokens, tmp / "graph", true, checkpointing, data), tmp.path());
  auto a = engine::RunJob(eager_spec, {}, eager);
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = engine::RunJob(graph_spec, {}, graphed);
  ASSERT_TRUE(b.ok()) << b.status().message();
  // Where graphs run, they did; elsewhere the option changes nothing.
  EXPECT_EQ(Recorded(graphed), engine::StepGraph::Supported(TorchTestDevice()));
  EXPECT_FALSE(Recorded(eager));
  // Every step after the eager ones ran the graph (none fell back to launching kernel by kernel).
  if (engine::StepGraph::Supported(TorchTestDevice())) {
    EXPECT_TRUE(HasMessage(graphed, "the CUDA graph ran 5 of this run's 7 steps"));
  }

  ASSERT_EQ(eager.progress.size(), 7u);
  ASSERT_EQ(graphed.progress.size(), 7u);
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
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_EQ(x->size(), y->size());
  for (const auto& [name, t] : *x) {
    ASSERT_TRUE(y->count(name)) << name;
    EXPECT_LE(RelativeError(y->at(name), t), TestTolerances().logits) << name;
  }
}

TEST(StepGraph, TrainsAsTheKernelByKernelStep) { ExpectGraphTrainsAsEager(false); }

TEST(StepGraph, TrainsAsTheKernelByKernelStepWithCheckpointing) { ExpectGraphTrainsAsEager(true); }

// Packed rows: the graph's batches carry padded segments (empty ones at the
// end) that the kernel-by-kernel job's do not.
TEST(StepGraph, TrainsAsTheKernelByKernelStepOnPackedRows) { ExpectGraphTrainsAsEager(false, Data::kPacked); }

}  // namespace
}  // namespace trainerd::testing
