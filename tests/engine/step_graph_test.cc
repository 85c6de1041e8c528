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

engine::TokenExample Example(size_t length, bool packed = false) {
  engine::TokenExample ex;
  for (size_t i = 0; i < length; ++i) {
    ex.input_ids.push_back(static_cast<int64_t>(3 + i));
    ex.labels.push_back(static_cast<int64_t>(3 + i));
    if (packed) ex.position_ids.push_back(static_cast<int64_t>(i % 4));
  }
  return ex;
}

TEST(StepGraphObstacle, NamesWhatKeepsStepsFromOneGraph) {
  engine::TokenDataset same;
  for (int i = 0; i < 3; ++i) same.examples.push_back(Example(8));
  EXPECT_EQ(engine::StepGraphObstacle(same, false), "");

  engine::TokenDataset mixed = same;
  mixed.examples.push_back(Example(5));
  const std::string widths = engine::StepGraphObstacle(mixed, false);
  EXPECT_NE(widths.find("differ in length (from 8 to 5 tokens)"), std::string::npos) << widths;

  engine::TokenDataset packed = same;
  packed.examples.push_back(Example(8, true));
  EXPECT_NE(engine::StepGraphObstacle(packed, false).find("packed examples"), std::string::npos);

  EXPECT_NE(engine::StepGraphObstacle(same, true).find("LoRA dropout"), std::string::npos);
}

TEST(StepGraph, NotSupportedOnTheCpu) { EXPECT_FALSE(engine::StepGraph::Supported(torch::Device(torch::kCPU))); }

// 16 examples of 24 tokens with a pattern the model can learn (so the loss
// moves from step to step) and prompts of varying length masked out of the
// labels (so each step has its own target count).
std::string WriteTokens(const std::string& dir) {
  const std::string path = dir + "/tokens.jsonl";
  std::ofstream out(path);
  for (int e = 0; e < 16; ++e) {
    std::string ids, labels;
    const int prompt = 2 + (e * 5) % 9;
    for (int i = 0; i < 24; ++i) {
      const int id = 10 + (e * 7 + i * (1 + e % 3)) % 200;
      ids += (i ? ", " : "") + std::to_string(id);
      labels += (i ? ", " : "") + std::to_string(i < prompt ? -100 : id);
    }
    out << "{\"input_ids\": [" << ids << "], \"labels\": [" << labels << "]}\n";
  }
  return path;
}

std::string GraphJob(const std::string& tokens, const std::string& out, bool graphs, bool checkpointing) {
  return "model:\n  path: " + Fixture("llama/model") + "\n  dtype: " + TestDtype() +
         "\nadapter:\n  r: 4\n  alpha: 8\n  dropout: 0.0\n  target_modules: all-linear\n"
         "data:\n  train: " + tokens + "\n  format: tokens\n  shuffle: true\n  max_seq_len: 24\n  cache: false\n"
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

void ExpectGraphTrainsAsEager(bool checkpointing) {
  TempDir tmp;
  const std::string tokens = WriteTokens(tmp.path());
  RecordingReporter eager, graphed;
  auto a = engine::RunJob(SpecFromYaml(GraphJob(tokens, tmp / "eager", false, checkpointing), tmp.path()), {}, eager);
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = engine::RunJob(SpecFromYaml(GraphJob(tokens, tmp / "graph", true, checkpointing), tmp.path()), {}, graphed);
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

}  // namespace
}  // namespace trainerd::testing
