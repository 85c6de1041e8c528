#include "common/job_spec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace trainerd {
namespace {

namespace fs = std::filesystem;

// The three keys every finetune spec needs, on lines 1-3.
const char kMinimal[] =
    "model: {path: base}\n"
    "data: {train: train.jsonl}\n"
    "output: {dir: out}\n";

StatusOr<JobSpec> Parse(const std::string& text) {
  return ParseJobSpecText(text, "job.yaml", "/jobs");
}

// Expects `text` to be rejected with a message holding every one of `parts`
// (typically "job.yaml:LINE:", the dotted key and what was wrong).
void ExpectError(const std::string& text, std::initializer_list<std::string> parts) {
  const StatusOr<JobSpec> spec = Parse(text);
  ASSERT_FALSE(spec.ok()) << "accepted:\n" << text;
  for (const std::string& part : parts) {
    EXPECT_NE(spec.status().message().find(part), std::string::npos)
        << "message: " << spec.status().message() << "\nlacks: " << part;
  }
}

TEST(JobSpecTest, FullSpecSetsEveryKey) {
  const StatusOr<JobSpec> spec = Parse(R"(# every key
task: finetune
model:
  path: models/llama
  dtype: bfloat16
adapter:
  type: lora
  r: 16
  alpha: 32
  dropout: 0.05
  target_modules: [q_proj, v_proj, down_proj]
  use_rslora: true
  init: adapters/previous
data:
  train: data/train.jsonl
  eval: data/eval.jsonl
  format: completion
  max_seq_len: 4096
  shuffle: false
  train_on_prompt: true
training:
  epochs: 2.5
  max_steps: 1000
  micro_batch_size: 4
  gradient_accumulation_steps: 8
  learning_rate: 1.5e-4
  lr_scheduler: cosine
  warmup_steps: 100
  weight_decay: 0.01
  adam_beta1: 0.8
  adam_beta2: 0.95
  adam_epsilon: 1e-6
  max_grad_norm: 0
  seed: 18446744073709551615
  eval_every: 50
  checkpoint_every: 200
  checkpoint_keep: 3
  log_every: 10
output:
  dir: runs/one
  merge: true
device: cuda:1
)");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->source, "job.yaml");
  EXPECT_EQ(spec->base_dir, "/jobs");
  EXPECT_EQ(spec->task, "finetune");
  EXPECT_EQ(spec->model.path, "/jobs/models/llama");
  EXPECT_EQ(spec->model.dtype, "bfloat16");
  ASSERT_TRUE(spec->adapter.has_value());
  const AdapterSpec& adapter = *spec->adapter;
  EXPECT_EQ(adapter.type, "lora");
  EXPECT_EQ(adapter.r, 16);
  EXPECT_EQ(adapter.alpha, 32.0);
  EXPECT_EQ(adapter.dropout, 0.05);
  EXPECT_EQ(adapter.target_modules, (std::vector<std::string>{"q_proj", "v_proj", "down_proj"}));
  EXPECT_TRUE(adapter.use_rslora);
  EXPECT_EQ(adapter.init, "/jobs/adapters/previous");
  EXPECT_TRUE(adapter.r_set);
  EXPECT_TRUE(adapter.alpha_set);
  EXPECT_TRUE(adapter.dropout_set);
  EXPECT_TRUE(adapter.target_modules_set);
  EXPECT_TRUE(adapter.use_rslora_set);
  EXPECT_EQ(spec->data.train, "/jobs/data/train.jsonl");
  EXPECT_EQ(spec->data.eval, "/jobs/data/eval.jsonl");
  EXPECT_EQ(spec->data.format, "completion");
  EXPECT_EQ(spec->data.max_seq_len, 4096);
  EXPECT_FALSE(spec->data.shuffle);
  EXPECT_TRUE(spec->data.train_on_prompt);
  const JobSpec::Training& t = spec->training;
  EXPECT_EQ(t.epochs, 2.5);
  EXPECT_EQ(t.max_steps, 1000);
  EXPECT_EQ(t.micro_batch_size, 4);
  EXPECT_EQ(t.gradient_accumulation_steps, 8);
  EXPECT_EQ(t.learning_rate, 1.5e-4);
  EXPECT_EQ(t.lr_scheduler, "cosine");
  EXPECT_EQ(t.warmup_steps, 100);
  EXPECT_EQ(t.weight_decay, 0.01);
  EXPECT_EQ(t.adam_beta1, 0.8);
  EXPECT_EQ(t.adam_beta2, 0.95);
  EXPECT_EQ(t.adam_epsilon, 1e-6);
  EXPECT_EQ(t.max_grad_norm, 0.0);
  EXPECT_EQ(t.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(t.eval_every, 50);
  EXPECT_EQ(t.checkpoint_every, 200);
  EXPECT_EQ(t.checkpoint_keep, 3);
  EXPECT_EQ(t.log_every, 10);
  EXPECT_EQ(spec->output.dir, "/jobs/runs/one");
  EXPECT_TRUE(spec->output.merge);
  EXPECT_EQ(spec->device, "cuda:1");
}

TEST(JobSpecTest, MinimalSpecGetsDefaults) {
  const StatusOr<JobSpec> spec = Parse(kMinimal);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  const JobSpec defaults;
  EXPECT_EQ(spec->task, "finetune");
  EXPECT_EQ(spec->model.dtype, "auto");
  EXPECT_FALSE(spec->adapter.has_value()) << "no adapter section means full fine-tuning";
  EXPECT_EQ(spec->data.eval, "");
  EXPECT_EQ(spec->data.format, "tokens");
  EXPECT_EQ(spec->data.max_seq_len, 2048);
  EXPECT_TRUE(spec->data.shuffle);
  EXPECT_FALSE(spec->data.train_on_prompt);
  const JobSpec::Training& t = spec->training;
  EXPECT_EQ(t.epochs, 1.0);
  EXPECT_EQ(t.max_steps, 0);
  EXPECT_EQ(t.micro_batch_size, 1);
  EXPECT_EQ(t.gradient_accumulation_steps, 1);
  EXPECT_EQ(t.learning_rate, 2e-4);
  EXPECT_EQ(t.lr_scheduler, "linear");
  EXPECT_EQ(t.warmup_steps, 0);
  EXPECT_EQ(t.weight_decay, 0.0);
  EXPECT_EQ(t.adam_beta1, 0.9);
  EXPECT_EQ(t.adam_beta2, 0.999);
  EXPECT_EQ(t.adam_epsilon, 1e-8);
  EXPECT_EQ(t.max_grad_norm, 1.0);
  EXPECT_EQ(t.seed, 42u);
  EXPECT_EQ(t.eval_every, 0);
  EXPECT_EQ(t.checkpoint_every, 0);
  EXPECT_EQ(t.checkpoint_keep, 2);
  EXPECT_EQ(t.log_every, 1);
  EXPECT_FALSE(spec->output.merge);
  EXPECT_EQ(spec->device, "auto");
}

TEST(JobSpecTest, EmptyAdapterSectionIsLoraWithDefaults) {
  for (const char* adapter : {"adapter:\n", "adapter: {}\n"}) {
    SCOPED_TRACE(adapter);
    const StatusOr<JobSpec> spec = Parse(std::string(kMinimal) + adapter);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    ASSERT_TRUE(spec->adapter.has_value());
    const AdapterSpec& a = *spec->adapter;
    EXPECT_EQ(a.type, "lora");
    EXPECT_EQ(a.r, 8);
    EXPECT_EQ(a.alpha, 16.0);
    EXPECT_EQ(a.dropout, 0.0);
    EXPECT_EQ(a.target_modules, (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"}));
    EXPECT_FALSE(a.use_rslora);
    EXPECT_EQ(a.init, "");
    EXPECT_FALSE(a.r_set || a.alpha_set || a.dropout_set || a.target_modules_set ||
                 a.use_rslora_set);
  }
}

TEST(JobSpecTest, SetFlagsRecordOnlyWrittenAdapterKeys) {
  const StatusOr<JobSpec> spec =
      Parse(std::string(kMinimal) + "adapter: {r: 8, use_rslora: false}\n");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_TRUE(spec->adapter->r_set);
  EXPECT_TRUE(spec->adapter->use_rslora_set);
  EXPECT_FALSE(spec->adapter->alpha_set);
  EXPECT_FALSE(spec->adapter->dropout_set);
  EXPECT_FALSE(spec->adapter->target_modules_set);
}

TEST(JobSpecTest, AllLinearMeansAllSevenModules) {
  const StatusOr<JobSpec> spec =
      Parse(std::string(kMinimal) + "adapter:\n  target_modules: all-linear\n");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->adapter->target_modules,
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"}));
  EXPECT_TRUE(spec->adapter->target_modules_set);
}

TEST(JobSpecTest, RelativePathsResolveAgainstBaseDir) {
  const StatusOr<JobSpec> spec = ParseJobSpecText(
      "model: {path: ./models/../models/llama/}\n"
      "adapter: {init: /abs/adapter/./x}\n"
      "data: {train: ../shared/train.jsonl, eval: ~/eval.jsonl}\n"
      "output: {dir: out/}\n",
      "jobs/job.yaml", "/home/ana/jobs");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->base_dir, "/home/ana/jobs");
  EXPECT_EQ(spec->model.path, "/home/ana/jobs/models/llama");
  EXPECT_EQ(spec->adapter->init, "/abs/adapter/x") << "absolute paths stay, normalised";
  EXPECT_EQ(spec->data.train, "/home/ana/shared/train.jsonl");
  EXPECT_EQ(spec->data.eval, "/home/ana/jobs/~/eval.jsonl") << "~ is not expanded";
  EXPECT_EQ(spec->output.dir, "/home/ana/jobs/out");
}

class JobSpecFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("job_spec_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "jobs");
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};

TEST_F(JobSpecFileTest, FileSpecResolvesAgainstItsFolder) {
  const fs::path file = dir_ / "jobs" / "job.yaml";
  std::ofstream(file) << kMinimal;
  const StatusOr<JobSpec> spec = ParseJobSpecFile(file.string());
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->source, file.string());
  EXPECT_EQ(spec->base_dir, (dir_ / "jobs").string());
  EXPECT_EQ(spec->model.path, (dir_ / "jobs" / "base").string());
  EXPECT_EQ(spec->output.dir, (dir_ / "jobs" / "out").string());
}

TEST_F(JobSpecFileTest, ErrorsNameTheFileAsGiven) {
  const fs::path file = dir_ / "jobs" / "bad.yaml";
  std::ofstream(file) << kMinimal << "training: {learning_rate: fast}\n";
  const StatusOr<JobSpec> spec = ParseJobSpecFile(file.string());
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find(file.string() + ":4: training.learning_rate"),
            std::string::npos)
      << spec.status().message();
}

TEST_F(JobSpecFileTest, MissingFile) {
  const std::string file = (dir_ / "nope.yaml").string();
  const StatusOr<JobSpec> spec = ParseJobSpecFile(file);
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find(file), std::string::npos) << spec.status().message();
  EXPECT_NE(spec.status().message().find("No such file"), std::string::npos)
      << spec.status().message();
}

TEST_F(JobSpecFileTest, FolderInsteadOfFile) {
  const StatusOr<JobSpec> spec = ParseJobSpecFile(dir_.string());
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("is a folder"), std::string::npos)
      << spec.status().message();
}

TEST(JobSpecTest, EvalTaskNeedsEvalDataNotTrainData) {
  const StatusOr<JobSpec> spec =
      Parse("task: eval\nmodel: {path: base}\ndata: {eval: eval.jsonl}\noutput: {dir: out}\n");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->task, "eval");
  EXPECT_EQ(spec->data.train, "");
  EXPECT_EQ(spec->data.eval, "/jobs/eval.jsonl");
}

TEST(JobSpecTest, AcceptsYamlSpellingsOfNumbersAndBools) {
  const StatusOr<JobSpec> spec = Parse(std::string(kMinimal) +
                                       "training:\n"
                                       "  learning_rate: 2e-4\n"
                                       "  epochs: 3\n"
                                       "  weight_decay: .5\n"
                                       "  max_steps: +7\n"
                                       "  adam_epsilon: \"1E-7\"\n"
                                       "device: cuda\n");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->training.learning_rate, 2e-4);
  EXPECT_EQ(spec->training.epochs, 3.0);
  EXPECT_EQ(spec->training.weight_decay, 0.5);
  EXPECT_EQ(spec->training.max_steps, 7);
  EXPECT_EQ(spec->training.adam_epsilon, 1e-7);
  EXPECT_EQ(spec->device, "cuda");
  for (const char* yes : {"true", "True", "yes", "on"}) {
    const StatusOr<JobSpec> merged = Parse(
        "model: {path: m}\ndata: {train: t}\noutput: {dir: o, merge: " + std::string(yes) + "}\nadapter: {}\n");
    ASSERT_TRUE(merged.ok()) << merged.status().message();
    EXPECT_TRUE(merged->output.merge) << yes;
  }
}

// Errors. Each names the file, the line and the key.

TEST(JobSpecTest, UnknownKeySuggestsClosestKnownKey) {
  ExpectError(std::string(kMinimal) + "training:\n  learnig_rate: 1e-4\n",
              {"job.yaml:5:", "unknown key 'training.learnig_rate'",
               "did you mean 'training.learning_rate'?"});
}

TEST(JobSpecTest, UnknownKeyInWrongSectionSuggestsItsSection) {
  ExpectError(std::string(kMinimal) + "epochs: 3\n",
              {"job.yaml:4:", "unknown key 'epochs'", "did you mean 'training.epochs'?"});
  ExpectError(
      std::string(kMinimal) + "training: {max_seq_len: 512}\n",
      {"job.yaml:4:", "unknown key 'training.max_seq_len'", "did you mean 'data.max_seq_len'?"});
}

TEST(JobSpecTest, UnknownKeyFromAnotherTrainerSuggestsOurs) {
  ExpectError(
      std::string(kMinimal) + "training: {lr: 1e-4}\n",
      {"job.yaml:4:", "unknown key 'training.lr'", "did you mean 'training.learning_rate'?"});
  ExpectError(std::string(kMinimal) + "adapter: {lora_alpha: 8}\n",
              {"job.yaml:4:", "unknown key 'adapter.lora_alpha'", "did you mean 'adapter.alpha'?"});
}

TEST(JobSpecTest, UnknownKeyFarFromAnyListsTheKnownKeys) {
  const StatusOr<JobSpec> spec = Parse(std::string(kMinimal) + "flux_capacitor: 88\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("job.yaml:4: unknown key 'flux_capacitor'"),
            std::string::npos)
      << spec.status().message();
  EXPECT_EQ(spec.status().message().find("did you mean"), std::string::npos)
      << spec.status().message();
  ExpectError(std::string(kMinimal) + "adapter: {targets: [q_proj]}\n",
              {"job.yaml:4:", "unknown key 'adapter.targets'",
               "adapter takes: type, r, alpha, dropout, target_modules, use_rslora, init"});
}

TEST(JobSpecTest, DottedKeyIsRejected) {
  ExpectError(std::string(kMinimal) + "training.learning_rate: 1e-4\n",
              {"job.yaml:4:", "training.learning_rate", "nested"});
}

TEST(JobSpecTest, WrongTypeForNumber) {
  ExpectError(std::string(kMinimal) + "training:\n  learning_rate: fast\n",
              {"job.yaml:5:", "training.learning_rate: expected a number, got 'fast'"});
  ExpectError(std::string(kMinimal) + "training:\n  learning_rate: .inf\n",
              {"job.yaml:5:", "training.learning_rate: expected a number, got '.inf'"});
  ExpectError(std::string(kMinimal) + "adapter:\n  alpha: [16]\n",
              {"job.yaml:5:", "adapter.alpha: expected a number, got a list"});
}

TEST(JobSpecTest, WrongTypeForInteger) {
  ExpectError(std::string(kMinimal) + "adapter:\n  r: 2.5\n",
              {"job.yaml:5:", "adapter.r: expected an integer, got '2.5'"});
  ExpectError(std::string(kMinimal) + "training: {max_steps: 1e3}\n",
              {"job.yaml:4:", "training.max_steps: expected an integer, got '1e3'"});
}

TEST(JobSpecTest, IntegerOutOfRangeOfItsType) {
  ExpectError(std::string(kMinimal) + "training: {max_steps: 99999999999999999999}\n",
              {"job.yaml:4:", "training.max_steps", "out of range"});
  ExpectError(std::string(kMinimal) + "training: {seed: 18446744073709551616}\n",
              {"job.yaml:4:", "training.seed", "out of range"});
}

TEST(JobSpecTest, SeedIsUnsigned) {
  ExpectError(std::string(kMinimal) + "training: {seed: -1}\n",
              {"job.yaml:4:", "training.seed: expected a non-negative integer, got '-1'"});
}

TEST(JobSpecTest, WrongTypeForBool) {
  ExpectError("model: {path: m}\noutput: {dir: o}\ndata:\n  train: t\n  shuffle: sometimes\n",
              {"job.yaml:5:", "data.shuffle: expected true or false, got 'sometimes'"});
}

TEST(JobSpecTest, WrongTypeForString) {
  ExpectError("model:\n  path: [a, b]\ndata: {train: t}\noutput: {dir: o}\n",
              {"job.yaml:2:", "model.path: expected a string, got a list"});
  ExpectError("model:\n  path: \"\"\ndata: {train: t}\noutput: {dir: o}\n",
              {"job.yaml:2:", "model.path: must not be empty"});
}

TEST(JobSpecTest, KeyWithoutValue) {
  ExpectError(std::string(kMinimal) + "training:\n  learning_rate:\n  epochs: 1\n",
              {"job.yaml:5:", "training.learning_rate: has no value"});
}

TEST(JobSpecTest, BadEnumValueListsAllowedValues) {
  ExpectError(std::string(kMinimal) + "training:\n  lr_scheduler: cosin\n",
              {"job.yaml:5:", "training.lr_scheduler: unknown value 'cosin'",
               "allowed: constant, linear, cosine", "did you mean 'cosine'?"});
  ExpectError("task: train\n" + std::string(kMinimal),
              {"job.yaml:1:", "task: unknown value 'train'", "allowed: finetune, eval"});
  ExpectError("model: {path: m, dtype: fp16}\ndata: {train: t}\noutput: {dir: o}\n",
              {"job.yaml:1:", "model.dtype: unknown value 'fp16'",
               "allowed: auto, float32, bfloat16, float16"});
}

TEST(JobSpecTest, DataFormatsAccepted) {
  for (const char* format : {"auto", "tokens", "text", "completion"}) {
    const StatusOr<JobSpec> spec =
        Parse(std::string("model: {path: m}\ndata: {train: t, format: ") + format + "}\noutput: {dir: o}\n");
    ASSERT_TRUE(spec.ok()) << format << ": " << spec.status().message();
    EXPECT_EQ(spec->data.format, format);
  }
}

TEST(JobSpecTest, DataFormatUnknownListsAllowed) {
  ExpectError("model: {path: m}\ndata: {train: t, format: txt}\noutput: {dir: o}\n",
              {"job.yaml:2:", "data.format: unknown value 'txt'", "allowed: auto, tokens, text, completion",
               "did you mean 'text'?"});
}

TEST(JobSpecTest, ChatFormatAndTemplate) {
  auto spec = ParseJobSpecText("model: {path: m}\ndata: {train: t, format: chat, chat_template: qwen2.5}\n"
                               "output: {dir: o}\n", "job.yaml", "/base");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->data.format, "chat");
  EXPECT_EQ(spec->data.chat_template, "qwen2.5");
  ExpectError("model: {path: m}\ndata: {train: t, format: chat, chat_template: vicuna}\noutput: {dir: o}\n",
              {"job.yaml:2:", "data.chat_template: unknown value 'vicuna'", "auto, llama3, chatml"});
  ExpectError("model: {path: m}\ndata: {train: t, format: text,\n  chat_template: llama3}\noutput: {dir: o}\n",
              {"job.yaml:3:", "data.chat_template: only applies to chat data"});
}

TEST(JobSpecTest, DataCache) {
  auto spec = ParseJobSpecText("model: {path: m}\ndata: {train: t, cache_dir: c}\noutput: {dir: o}\n", "job.yaml",
                               "/base");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->data.cache_dir, "/base/c");
  EXPECT_TRUE(spec->data.cache);
  spec = ParseJobSpecText("model: {path: m}\ndata: {train: t, cache: false}\noutput: {dir: o}\n", "job.yaml", "/b");
  ASSERT_TRUE(spec.ok());
  EXPECT_FALSE(spec->data.cache);
}

TEST(JobSpecTest, TrainOnPrompt) {
  const StatusOr<JobSpec> spec =
      Parse("model: {path: m}\ndata: {train: t, format: auto, train_on_prompt: yes}\noutput: {dir: o}\n");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_TRUE(spec->data.train_on_prompt);
  ExpectError("model: {path: m}\ndata: {train: t, format: completion, train_on_prompt: sometimes}\noutput: {dir: o}\n",
              {"job.yaml:2:", "data.train_on_prompt: expected true or false"});
  // tokens data carries its own labels.
  ExpectError("model: {path: m}\ndata:\n  train: t\n  train_on_prompt: true\noutput: {dir: o}\n",
              {"job.yaml:4:", "data.train_on_prompt", "data.format tokens"});
}

TEST(JobSpecTest, AdapterTypeIsLoraOnly) {
  ExpectError(std::string(kMinimal) + "adapter:\n  type: ia3\n",
              {"job.yaml:5:", "adapter.type: unknown value 'ia3'", "allowed: lora"});
}

TEST(JobSpecTest, BadDevice) {
  for (const char* device : {"gpu", "cuda:", "cuda:-1", "cuda:x", "CUDA"}) {
    SCOPED_TRACE(device);
    ExpectError(std::string(kMinimal) + "device: \"" + device + "\"\n",
                {"job.yaml:4:", "device: unknown value", "auto, cpu, cuda, cuda:N"});
  }
  const StatusOr<JobSpec> spec = Parse(std::string(kMinimal) + "device: cpu\n");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->device, "cpu");
}

// Out-of-range values: each case is one key, one bad value and the bound it breaks.
struct RangeCase {
  const char* section;
  const char* key;
  const char* value;
  const char* bound;
};

void PrintTo(const RangeCase& c, std::ostream* os) {
  *os << c.section << "." << c.key << ": " << c.value;
}

class JobSpecRangeTest : public ::testing::TestWithParam<RangeCase> {};

TEST_P(JobSpecRangeTest, OutOfRangeValueIsRejected) {
  const RangeCase& c = GetParam();
  const std::string section = c.section;
  // The bad value is on line 4; data.train is added to the data section or after it.
  ExpectError("model: {path: m}\noutput: {dir: o}\n" + section + ":\n  " + c.key + ": " + c.value +
                  "\n" + (section == "data" ? "  train: t\n" : "data: {train: t}\n"),
              {"job.yaml:4:", section + "." + c.key + ": must be " + c.bound + ", got " + c.value});
}

INSTANTIATE_TEST_SUITE_P(AllBounds, JobSpecRangeTest,
                         ::testing::Values(RangeCase{"adapter", "r", "0", ">= 1"},
                                           RangeCase{"adapter", "alpha", "0", "> 0"},
                                           RangeCase{"adapter", "alpha", "-2", "> 0"},
                                           RangeCase{"adapter", "dropout", "1", "in [0, 1)"},
                                           RangeCase{"adapter", "dropout", "-0.1", "in [0, 1)"},
                                           RangeCase{"data", "max_seq_len", "1", ">= 2"},
                                           RangeCase{"training", "epochs", "0", "> 0"},
                                           RangeCase{"training", "max_steps", "-1", ">= 0"},
                                           RangeCase{"training", "micro_batch_size", "0", ">= 1"},
                                           RangeCase{"training", "gradient_accumulation_steps", "0",
                                                     ">= 1"},
                                           RangeCase{"training", "learning_rate", "0", "> 0"},
                                           RangeCase{"training", "warmup_steps", "-1", ">= 0"},
                                           RangeCase{"training", "weight_decay", "-0.01", ">= 0"},
                                           RangeCase{"training", "adam_beta1", "1.0", "in [0, 1)"},
                                           RangeCase{"training", "adam_beta2", "-0.5", "in [0, 1)"},
                                           RangeCase{"training", "adam_epsilon", "0", "> 0"},
                                           RangeCase{"training", "max_grad_norm", "-1", ">= 0"},
                                           RangeCase{"training", "eval_every", "-5", ">= 0"},
                                           RangeCase{"training", "checkpoint_every", "-5", ">= 0"},
                                           RangeCase{"training", "checkpoint_keep", "0", ">= 1"},
                                           RangeCase{"training", "log_every", "0", ">= 1"}),
                         [](const ::testing::TestParamInfo<RangeCase>& info) {
                           return std::string(info.param.section) + "_" + info.param.key + "_" +
                                  std::to_string(info.index);
                         });

TEST(JobSpecTest, BoundaryValuesAreAccepted) {
  const StatusOr<JobSpec> spec = Parse(std::string(kMinimal) +
                                       "adapter: {r: 1, dropout: 0}\n"
                                       "training: {max_steps: 0, adam_beta1: 0, max_grad_norm: 0, "
                                       "weight_decay: 0, checkpoint_keep: 1, eval_every: 0}\n");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
}

TEST(JobSpecTest, MicroBatchSizeAutoAndGradientCheckpointing) {
  const StatusOr<JobSpec> spec =
      Parse(std::string(kMinimal) + "training: {micro_batch_size: auto, gradient_checkpointing: true}\n");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_TRUE(spec->training.micro_batch_size_auto);
  EXPECT_TRUE(spec->training.gradient_checkpointing);
  const StatusOr<JobSpec> fixed = Parse(std::string(kMinimal) + "training: {micro_batch_size: 8}\n");
  ASSERT_TRUE(fixed.ok()) << fixed.status().message();
  EXPECT_FALSE(fixed->training.micro_batch_size_auto);
  EXPECT_FALSE(fixed->training.gradient_checkpointing);
  EXPECT_EQ(fixed->training.micro_batch_size, 8);
  ExpectError(std::string(kMinimal) + "training:\n  micro_batch_size: big\n",
              {"job.yaml:5:", "training.micro_batch_size", "expected an integer >= 1 or auto"});
}

TEST(JobSpecTest, GradientCheckpointingLayers) {
  const StatusOr<JobSpec> spec = Parse(std::string(kMinimal) +
                                       "training: {gradient_checkpointing: true, gradient_checkpointing_layers: 20}\n");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->training.gradient_checkpointing_layers, 20);
  const StatusOr<JobSpec> all = Parse(std::string(kMinimal) + "training: {gradient_checkpointing: true}\n");
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_EQ(all->training.gradient_checkpointing_layers, 0);
  ExpectError(std::string(kMinimal) + "training:\n  gradient_checkpointing_layers: 4\n",
              {"job.yaml:5:", "training.gradient_checkpointing_layers", "gradient_checkpointing is off"});
  ExpectError(std::string(kMinimal) + "training:\n  gradient_checkpointing: true\n  gradient_checkpointing_layers: 0\n",
              {"job.yaml:6:", "training.gradient_checkpointing_layers"});
}

TEST(JobSpecTest, CudaGraphs) {
  const StatusOr<JobSpec> unset = Parse(kMinimal);
  ASSERT_TRUE(unset.ok()) << unset.status().message();
  EXPECT_TRUE(unset->training.cuda_graphs);
  const StatusOr<JobSpec> off = Parse(std::string(kMinimal) + "training: {cuda_graphs: false}\n");
  ASSERT_TRUE(off.ok()) << off.status().message();
  EXPECT_FALSE(off->training.cuda_graphs);
  ExpectError(std::string(kMinimal) + "training:\n  cuda_graphs: sometimes\n", {"job.yaml:5:", "training.cuda_graphs"});
}

TEST(JobSpecTest, DuplicateKey) {
  ExpectError(std::string(kMinimal) + "training:\n  seed: 1\n  epochs: 2\n  seed: 2\n",
              {"job.yaml:7:", "duplicate key 'training.seed'", "first set on line 5"});
}

TEST(JobSpecTest, DuplicateSection) {
  ExpectError(std::string(kMinimal) + "data: {eval: e}\n",
              {"job.yaml:4:", "duplicate key 'data'", "first set on line 2"});
}

TEST(JobSpecTest, SectionThatIsNotAMap) {
  ExpectError("model: /models/llama\ndata: {train: t}\noutput: {dir: o}\n",
              {"job.yaml:1:", "model: expected a section", "got '/models/llama'",
               "model: {path: /models/llama}"});
  ExpectError(std::string(kMinimal) + "training:\n  - epochs: 1\n",
              {"job.yaml:4:", "training: expected a section", "got a list"});
}

TEST(JobSpecTest, YamlSyntaxErrorHasLine) {
  ExpectError("model: {path: m}\ndata: {train: t\noutput: {dir: o}\n",
              {"job.yaml:", "YAML syntax error"});
  ExpectError("model:\n  path: m\n bad: indentation\n", {"job.yaml:3:", "YAML syntax error"});
}

TEST(JobSpecTest, EmptyFile) {
  ExpectError("", {"job.yaml:", "empty"});
  ExpectError("# only a comment\n\n", {"job.yaml:", "empty"});
}

TEST(JobSpecTest, TopLevelMustBeAMap) {
  ExpectError("- model\n- data\n", {"job.yaml:1:", "map of keys", "got a list"});
  ExpectError("just words\n", {"job.yaml:1:", "map of keys", "got 'just words'"});
}

TEST(JobSpecTest, SecondDocumentIsRejected) {
  ExpectError(std::string(kMinimal) + "---\n" + kMinimal, {"job.yaml:", "second YAML document"});
}

TEST(JobSpecTest, MissingModelPath) {
  ExpectError("model: {dtype: float32}\ndata: {train: t}\noutput: {dir: o}\n",
              {"job.yaml:1:", "missing required key 'model.path'"});
  ExpectError("data: {train: t}\noutput: {dir: o}\n",
              {"job.yaml: missing required key 'model.path'"});
}

TEST(JobSpecTest, FinetuneNeedsTrainData) {
  ExpectError("model: {path: m}\ndata: {eval: e}\noutput: {dir: o}\n",
              {"job.yaml:2:", "missing required key 'data.train'", "task finetune"});
}

TEST(JobSpecTest, EvalNeedsEvalData) {
  ExpectError("task: eval\nmodel: {path: m}\ndata: {train: t}\noutput: {dir: o}\n",
              {"job.yaml:3:", "missing required key 'data.eval'", "task eval"});
}

TEST(JobSpecTest, OutputDirIsRequired) {
  ExpectError("model: {path: m}\ndata: {train: t}\n",
              {"job.yaml: missing required key 'output.dir'"});
  ExpectError("task: eval\nmodel: {path: m}\ndata: {eval: e}\noutput: {merge: false}\n",
              {"job.yaml:4:", "missing required key 'output.dir'"});
}

TEST(JobSpecTest, DuplicateTargetModule) {
  ExpectError(std::string(kMinimal) +
                  "adapter:\n"
                  "  target_modules:\n"
                  "    - q_proj\n"
                  "    - v_proj\n"
                  "    - q_proj\n",
              {"job.yaml:8:", "adapter.target_modules: 'q_proj' is listed twice"});
}

TEST(JobSpecTest, UnknownTargetModule) {
  ExpectError(
      std::string(kMinimal) + "adapter:\n  target_modules: [q_proj,\n    v_porj]\n",
      {"job.yaml:6:", "adapter.target_modules: unknown module 'v_porj'", "did you mean 'v_proj'?"});
  ExpectError(std::string(kMinimal) + "adapter:\n  target_modules: [all-linear]\n",
              {"job.yaml:5:", "adapter.target_modules", "target_modules: all-linear"});
}

TEST(JobSpecTest, TargetModulesMustBeAListOrAllLinear) {
  ExpectError(std::string(kMinimal) + "adapter:\n  target_modules: q_proj\n",
              {"job.yaml:5:",
               "adapter.target_modules: expected a list of module names or "
               "'all-linear', got 'q_proj'",
               "[q_proj]"});
  ExpectError(std::string(kMinimal) + "adapter:\n  target_modules: []\n",
              {"job.yaml:5:", "adapter.target_modules: must name at least one module"});
}

}  // namespace
}  // namespace trainerd

namespace trainerd {
namespace {

// The message's lines, for specs with several errors (one a line).
std::vector<std::string> Lines(const std::string& message) {
  std::vector<std::string> lines;
  std::istringstream in(message);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(JobSpecErrorsTest, EveryKeysErrorComesBackOneALineInTheFilesOrder) {
  const StatusOr<JobSpec> spec = Parse(std::string(kMinimal) +
                                       "training:\n"
                                       "  learning_rate: fast\n"   // line 5
                                       "  epochs: 1\n"
                                       "  micro_batch_size: abc\n"  // line 7
                                       "adapter:\n"
                                       "  rank: 8\n"                // line 9: unknown
                                       "  alpha: 16\n"
                                       "device: tpu\n");            // line 11
  ASSERT_FALSE(spec.ok());
  const std::vector<std::string> lines = Lines(spec.status().message());
  ASSERT_EQ(lines.size(), 4u) << spec.status().message();
  EXPECT_EQ(lines[0].rfind("job.yaml:5: training.learning_rate: expected a number", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("job.yaml:7: training.micro_batch_size:", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("job.yaml:9: unknown key 'adapter.rank'", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("job.yaml:11: device:", 0), 0u) << lines[3];
}

TEST(JobSpecErrorsTest, EveryMissingKeyAndConflictComesBackOnceTheKeysRead) {
  const StatusOr<JobSpec> spec = Parse("training: {eval_every: 10}\noutput: {merge: true}\n");
  ASSERT_FALSE(spec.ok());
  const std::vector<std::string> lines = Lines(spec.status().message());
  ASSERT_EQ(lines.size(), 5u) << spec.status().message();
  EXPECT_NE(lines[0].find("missing required key 'model.path'"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("missing required key 'data.train'"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("job.yaml:2: missing required key 'output.dir'"), std::string::npos) << lines[2];
  EXPECT_NE(lines[3].find("job.yaml:1: training.eval_every: asks for evaluations"), std::string::npos) << lines[3];
  EXPECT_NE(lines[4].find("job.yaml:2: output.merge: merges an adapter"), std::string::npos) << lines[4];
}

TEST(JobSpecErrorsTest, AKeyWhoseValueWasRefusedIsNotAlsoReportedMissing) {
  const StatusOr<JobSpec> spec = Parse("model:\n  path: [a, b]\ndata: {train: t}\noutput: {dir: o}\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(Lines(spec.status().message()).size(), 1u) << spec.status().message();
  EXPECT_EQ(spec.status().message().find("missing"), std::string::npos) << spec.status().message();
}

TEST(JobSpecConflictTest, EvalEveryWithoutEvalData) {
  auto spec = ParseJobSpecText(
      "model: {path: /m}\ndata: {train: /t.jsonl}\noutput: {dir: /o}\ntraining:\n  eval_every: 10\n", "job.yaml", "/");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("job.yaml:5: training.eval_every"), std::string::npos)
      << spec.status().message();
  EXPECT_NE(spec.status().message().find("data.eval"), std::string::npos);
}

TEST(JobSpecConflictTest, MergeWithoutAdapter) {
  auto spec = ParseJobSpecText("model: {path: /m}\ndata: {train: /t.jsonl}\noutput:\n  dir: /o\n  merge: true\n",
                               "job.yaml", "/");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("job.yaml:5: output.merge"), std::string::npos) << spec.status().message();
}

}  // namespace
}  // namespace trainerd

namespace trainerd {
namespace {

TEST(JobSpecPackingTest, PackingIsABoolDefaultingToFalse) {
  auto plain = ParseJobSpecText("model: {path: /m}\ndata: {train: /t.jsonl}\noutput: {dir: /o}\n", "job.yaml", "/");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->data.packing);
  auto packed = ParseJobSpecText("model: {path: /m}\ndata: {train: /t.jsonl, packing: true}\noutput: {dir: /o}\n",
                                 "job.yaml", "/");
  ASSERT_TRUE(packed.ok()) << packed.status().message();
  EXPECT_TRUE(packed->data.packing);
  auto wrong = ParseJobSpecText("model: {path: /m}\ndata:\n  train: /t.jsonl\n  packing: lots\noutput: {dir: /o}\n",
                                "job.yaml", "/");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("job.yaml:4: data.packing"), std::string::npos) << wrong.status().message();
}

}  // namespace
}  // namespace trainerd
