// The YAML job spec: what one fine-tuning or evaluation job does.
//
// ParseJobSpecFile/ParseJobSpecText turn a spec into a validated JobSpec or a
// Status whose message names the file, line and dotted key
// ("job.yaml:7: training.learning_rate: expected a number, got 'fast'"): every
// key's error, one a line; once the keys read cleanly, every missing key and
// conflict between keys the same way.
// docs/job-spec.md documents every key for users; keep the two in step.
//
// Torch-free and yaml-cpp-free: plain structs, so that the engine (LibTorch),
// the worker (protobuf) and the daemon can all include it.
//
// A parsed JobSpec satisfies every rule the parser checks: enum-like strings hold
// one of their allowed values, numbers are in range, the keys the task needs are
// present and every path is absolute (given an absolute base_dir) and lexically
// normal, with no trailing separator. Whether files exist is not checked here:
// the engine does that when it opens them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace trainerd {

// The linear layers of a Llama decoder layer that LoRA can adapt, in the order
// "all-linear" expands to.
// The chat templates built into the engine (engine/chat_template.h renders
// them); data.chat_template is one of these or "auto".
inline const std::vector<std::string>& BuiltinChatTemplateNames() {
  static const std::vector<std::string> names = {"llama3",  "chatml",       "qwen2", "qwen2.5",
                                                 "mistral", "mistral-v0.1", "llama2"};
  return names;
}

// The tokenized-data cache folder when data.cache_dir is not set:
// $XDG_CACHE_HOME/trainerd/datasets, else ~/.cache/trainerd/datasets; empty
// (no cache) when neither variable is set.
std::string DefaultDataCacheDir();

inline const std::vector<std::string>& AllLinearModules() {
  static const std::vector<std::string> kModules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                    "gate_proj", "up_proj", "down_proj"};
  return kModules;
}

struct AdapterSpec {
  std::string type = "lora";  // only "lora"
  int64_t r = 8;              // >= 1
  double alpha = 16;          // > 0; scaling is alpha / r, or alpha / sqrt(r) with use_rslora
  double dropout = 0.0;       // in [0, 1)
  // Distinct names from AllLinearModules(), in the order written; "all-linear" in
  // the spec becomes all seven.
  std::vector<std::string> target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  bool use_rslora = false;
  std::string init;  // folder of an existing PEFT adapter to start from; absolute or empty

  // Which fields were written in the spec rather than defaulted, so that the
  // adapter_config.json found in `init` can be checked against them.
  bool r_set = false, alpha_set = false, target_modules_set = false, use_rslora_set = false,
       dropout_set = false;
};

struct JobSpec {
  std::string source;             // the spec file's path as given, for messages
  std::string base_dir;           // the folder relative paths were resolved against
  std::string task = "finetune";  // finetune | eval

  struct Model {
    std::string path;            // Hugging Face model folder; required
    std::string dtype = "auto";  // auto | float32 | bfloat16 | float16
  } model;

  // Absent when the spec has no `adapter:` section: full fine-tuning.
  std::optional<AdapterSpec> adapter;

  struct Data {
    std::string train;              // required by task finetune
    std::string eval;               // required by task eval; optional for finetune
    std::string format = "tokens";  // auto | tokens | text | completion | chat
    std::string chat_template = "auto";  // auto (the model's) or a BuiltinChatTemplateNames() entry
    int64_t max_seq_len = 2048;     // >= 2; longer examples are truncated
    bool shuffle = true;
    bool train_on_prompt = false;  // completion/chat data: train the prompt's tokens too
    bool cache = true;             // keep the tokenized data in cache_dir
    std::string cache_dir = DefaultDataCacheDir();
    bool packing = false;  // several examples per sequence, attention and positions reset at each
  } data;

  struct Training {
    double epochs = 1;             // > 0; fractional epochs allowed
    int64_t max_steps = 0;         // optimizer steps; 0 = derive from epochs, else overrides epochs
    int64_t micro_batch_size = 1;  // >= 1; with micro_batch_size_auto, what the worker chose
    // `micro_batch_size: auto`: the worker picks the largest micro-batch that
    // fits the GPU's memory (engine/micro_batch_probe.h) before the first step.
    bool micro_batch_size_auto = false;
    // Recompute each decoder layer's activations in the backward pass instead
    // of keeping them (engine/activation_checkpoint.h): less memory, ~1/3 more work.
    bool gradient_checkpointing = false;
    // With gradient_checkpointing: recompute only the first N decoder layers
    // and keep the rest's activations (more speed for the memory there is);
    // 0 = every layer. Checked against the model's layer count when it loads.
    int64_t gradient_checkpointing_layers = 0;
    int64_t gradient_accumulation_steps = 1;      // >= 1
    // Replay each micro-batch's forward and backward as the CUDA graph of its
    // shape (engine/step_graph.h); false: always launch the kernels one by one.
    bool cuda_graphs = true;
    double learning_rate = 2e-4;                  // > 0; peak, after warmup
    std::string lr_scheduler = "linear";          // constant | linear | cosine
    int64_t warmup_steps = 0;                     // >= 0
    double weight_decay = 0.0;                    // >= 0
    double adam_beta1 = 0.9, adam_beta2 = 0.999;  // each in [0, 1)
    double adam_epsilon = 1e-8;                   // > 0
    double max_grad_norm = 1.0;                   // >= 0; 0 = no clipping
    uint64_t seed = 42;
    int64_t eval_every = 0;        // steps; >= 0, 0 = no periodic evaluation
    int64_t checkpoint_every = 0;  // steps; >= 0, 0 = no periodic checkpoints
    int64_t checkpoint_keep = 2;   // >= 1: most recent checkpoints kept
    int64_t log_every = 1;         // steps; >= 1
  } training;

  struct Output {
    std::string dir;     // required
    bool merge = false;  // also export the model with the adapter merged in
  } output;

  std::string device = "auto";  // auto | cpu | cuda | cuda:N
};

// What the one running a job supplies for keys its spec leaves out. trainerd
// gives each job a default output folder (<state_dir>/jobs/<id>/output) and
// its configured checkpoint interval; the worker alone requires output.dir.
struct JobSpecDefaults {
  // False: a spec without output.dir parses, with output.dir left empty for
  // the caller to fill in.
  bool output_dir_required = true;
  // training.checkpoint_every when the spec does not set it (>= 0).
  int64_t checkpoint_every = 0;
};

// Reads and parses the spec at `path`. Relative paths in it resolve against the
// absolute form of the file's folder; `source` is `path` as given.
StatusOr<JobSpec> ParseJobSpecFile(const std::string& path, const JobSpecDefaults& defaults = {});

// Parses the YAML in `text`. `source` names it in messages (normally a path).
// Relative paths in the spec become base_dir/path, lexically normalised;
// base_dir should be absolute (the daemon passes the client's working folder).
StatusOr<JobSpec> ParseJobSpecText(const std::string& text, const std::string& source,
                                   const std::string& base_dir, const JobSpecDefaults& defaults = {});

}  // namespace trainerd
