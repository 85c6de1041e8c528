// Checkpoints and resume: a run stopped after a checkpoint and resumed gives
// exactly the uninterrupted run's losses and adapter on the CPU (dropout and
// shuffling on, so the RNG state and data position must be restored too).
#include <fstream>

#include "engine/checkpoint.h"
#include "engine/tensor_io.h"
#include "tests/engine/test_support.h"

namespace trainerd::testing {
namespace {

std::string LoraJob(const std::string& out, int64_t checkpoint_every, int64_t keep = 2, int64_t micro = 2) {
  return "model:\n  path: " + Fixture("llama/model") + "\n  dtype: float32\n"
         "adapter:\n  r: 4\n  alpha: 8\n  dropout: 0.1\n  target_modules: [q_proj, v_proj, down_proj]\n"
         "data:\n  train: " + Fixture("llama/lora_train/train.jsonl") + "\n  eval: " + Fixture("llama/eval.jsonl") +
         "\n  shuffle: true\n  max_seq_len: 20\n"
         "training:\n  max_steps: 12\n  micro_batch_size: " + std::to_string(micro) +
         "\n  gradient_accumulation_steps: 2\n  learning_rate: 0.01\n  lr_scheduler: cosine\n  warmup_steps: 2\n"
         "  weight_decay: 0.01\n  eval_every: 5\n  log_every: 1\n  seed: 3\n  checkpoint_every: " +
         std::to_string(checkpoint_every) + "\n  checkpoint_keep: " + std::to_string(keep) + "\n"
         "output:\n  dir: " + out + "\ndevice: cpu\n";
}

std::string FullJob(const std::string& out) {
  return "model:\n  path: " + Fixture("qwen2/model") + "\n  dtype: float32\n"
         "data:\n  train: " + Fixture("qwen2/full_train/train.jsonl") + "\n  shuffle: true\n"
         "training:\n  max_steps: 8\n  micro_batch_size: 3\n  learning_rate: 0.001\n  weight_decay: 0.1\n"
         "  log_every: 1\n  seed: 5\noutput:\n  dir: " + out + "\ndevice: cpu\n";
}

std::vector<double> Losses(const RecordingReporter& r) {
  std::vector<double> out;
  for (const auto& e : r.progress) out.push_back(e.loss);
  return out;
}

void ExpectSameTensors(const std::string& a, const std::string& b) {
  auto x = engine::ReadSafetensors(a);
  auto y = engine::ReadSafetensors(b);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_EQ(x->size(), y->size());
  for (const auto& [name, t] : *x) {
    ASSERT_TRUE(y->count(name)) << name;
    EXPECT_TRUE(torch::equal(t, y->at(name))) << name;
  }
}


TEST(Resume, StoppedAndResumedLoraRunEqualsUninterruptedRun) {
  TempDir tmp;
  RecordingReporter straight;
  auto full = engine::RunJob(SpecFromYaml(LoraJob(tmp / "a", 0), tmp.path()), {}, straight);
  ASSERT_TRUE(full.ok()) << full.status().message();
  ASSERT_EQ(straight.progress.size(), 12u);

  RecordingReporter first;
  first.stop_after_step = 5;
  engine::RunOptions stop_options;
  stop_options.stop = &first.stop;
  JobSpec spec = SpecFromYaml(LoraJob(tmp / "b", 0), tmp.path());
  auto stopped = engine::RunJob(spec, stop_options, first);
  ASSERT_TRUE(stopped.ok()) << stopped.status().message();
  EXPECT_TRUE(stopped->stopped);
  EXPECT_EQ(stopped->steps, 5);
  EXPECT_TRUE(fs::exists(tmp / "b/checkpoints/checkpoint-5/COMPLETE"));
  EXPECT_FALSE(fs::exists(tmp / "b/adapter"));

  RecordingReporter second;
  engine::RunOptions resume;
  resume.resume = true;
  auto resumed = engine::RunJob(spec, resume, second);
  ASSERT_TRUE(resumed.ok()) << resumed.status().message();
  EXPECT_EQ(second.info.resumed_from_step, 5);
  std::vector<double> joined = Losses(first);
  for (double l : Losses(second)) joined.push_back(l);
  EXPECT_EQ(joined, Losses(straight));  // bit-identical, not merely close
  ASSERT_FALSE(second.evals.empty());
  EXPECT_EQ(second.evals.back().eval_loss, straight.evals.back().eval_loss);
  ExpectSameTensors(tmp / "a/adapter/adapter_model.safetensors", tmp / "b/adapter/adapter_model.safetensors");
}

TEST(Resume, StoppedAndResumedFullFineTuneEqualsUninterruptedRun) {
  TempDir tmp;
  RecordingReporter straight;
  ASSERT_TRUE(engine::RunJob(SpecFromYaml(FullJob(tmp / "a"), tmp.path()), {}, straight).ok());
  RecordingReporter first;
  first.stop_after_step = 3;
  engine::RunOptions stop_options;
  stop_options.stop = &first.stop;
  JobSpec spec = SpecFromYaml(FullJob(tmp / "b"), tmp.path());
  ASSERT_TRUE(engine::RunJob(spec, stop_options, first).ok());
  RecordingReporter second;
  engine::RunOptions resume;
  resume.resume = true;
  ASSERT_TRUE(engine::RunJob(spec, resume, second).ok());
  std::vector<double> joined = Losses(first);
  for (double l : Losses(second)) joined.push_back(l);
  EXPECT_EQ(joined, Losses(straight));
  ExpectSameTensors(tmp / "a/model/model.safetensors", tmp / "b/model/model.safetensors");
}

TEST(Resume, KeepsOnlyTheNewestCheckpoints) {
  TempDir tmp;
  RecordingReporter r;
  ASSERT_TRUE(engine::RunJob(SpecFromYaml(LoraJob(tmp / "out", 2, 2), tmp.path()), {}, r).ok());
  // Checkpoints at 2, 4, 6, 8, 10 (none at the last step: the outputs are final); the newest two stay.
  EXPECT_EQ(r.checkpoints.size(), 5u);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(tmp / "out/checkpoints")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"checkpoint-10", "checkpoint-8"}));
  for (const char* file : {"state.json", "trainable.safetensors", "optimizer.pt", "rng.safetensors", "COMPLETE"}) {
    EXPECT_TRUE(fs::exists(tmp / (std::string("out/checkpoints/checkpoint-10/") + file))) << file;
  }
}

TEST(Resume, IncompleteCheckpointIsIgnored) {
  TempDir tmp;
  RecordingReporter r;
  ASSERT_TRUE(engine::RunJob(SpecFromYaml(LoraJob(tmp / "out", 4, 5), tmp.path()), {}, r).ok());
  // A crash while writing checkpoint-8 leaves a folder without COMPLETE.
  fs::remove(tmp / "out/checkpoints/checkpoint-8/COMPLETE");
  EXPECT_EQ(engine::FindLatestCheckpoint(tmp / "out/checkpoints"), tmp / "out/checkpoints/checkpoint-4");
}

TEST(Resume, RefusesACheckpointOfADifferentJob) {
  TempDir tmp;
  RecordingReporter first;
  first.stop_after_step = 2;
  engine::RunOptions stop_options;
  stop_options.stop = &first.stop;
  ASSERT_TRUE(engine::RunJob(SpecFromYaml(LoraJob(tmp / "out", 0), tmp.path()), stop_options, first).ok());
  RecordingReporter second;
  engine::RunOptions resume;
  resume.resume = true;
  auto r = engine::RunJob(SpecFromYaml(LoraJob(tmp / "out", 0, 2, /*micro=*/3), tmp.path()), resume, second);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("training.micro_batch_size"), std::string::npos) << r.status().message();
  // The stop is seen when step 2's progress arrives, which is read back a step late: the newest
  // checkpoint is the one the message must name.
  const auto latest = engine::FindLatestCheckpoint(tmp / "out/checkpoints");
  ASSERT_TRUE(latest.has_value());
  EXPECT_NE(r.status().message().find(fs::path(*latest).filename().string()), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace trainerd::testing
