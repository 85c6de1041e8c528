// The engine's public API: torch-free, so that the worker's protobuf and
// logging code never shares a translation unit with LibTorch headers
// (shared/gpu/README.md, trap 1).
//
// RunJob runs one job (task finetune or eval) of a parsed JobSpec to the end,
// reporting through a Reporter. Library code does not log: everything a user
// should see goes through the Reporter or the returned Status.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"
#include "engine/step_profiler.h"

namespace trainerd::engine {

// What a run is about to do; sent once, after the model and data are loaded.
struct RunInfo {
  std::string device;          // "cpu", "cuda:0"
  std::string dtype;           // "float32", "bfloat16", "float16"
  std::string model_type;      // config.json model_type
  int64_t total_params = 0;
  int64_t trainable_params = 0;
  int64_t train_examples = 0;  // after dropping those with nothing to train
  int64_t train_tokens = 0;    // tokens of those examples (after truncation)
  int64_t trained_tokens = 0;  // of which targets of the loss
  int64_t dropped_examples = 0;
  int64_t truncated_examples = 0;
  int64_t total_steps = 0;
  int64_t resumed_from_step = 0;  // 0 when starting fresh
};

// One optimizer step's figures, sent every training.log_every steps.
struct ProgressEvent {
  int64_t step = 0;         // 1-based optimizer step just finished
  int64_t total_steps = 0;
  double epoch = 0;         // fractional epochs of training data consumed
  double loss = 0;          // mean over target tokens of the steps since the last event
  double lr = 0;            // learning rate the last step used
  double grad_norm = 0;     // global L2 norm before clipping, last step
  int64_t tokens = 0;       // non-padding input tokens trained so far (cumulative)
  double tokens_per_s = 0;  // non-padding tokens per second since the last event
  // Model FLOPs utilisation since the last event: engine/flops.h's FLOPs over
  // the time and the GPU's datasheet bf16 peak; 0 on the CPU, in float32, or
  // on a GPU the table does not know.
  double mfu = 0;
  double elapsed_s = 0;
  double eta_s = 0;
  int64_t peak_memory_bytes = 0;  // most GPU memory allocated so far (CUDA caching allocator); 0 on the CPU
};

struct EvalEvent {
  int64_t step = 0;  // 0 for task eval
  double eval_loss = 0;
  int64_t eval_tokens = 0;
};

struct CheckpointEvent {
  int64_t step = 0;
  std::string path;
};

// Receives a run's events on the thread that called RunJob. Implementations
// must not throw.
class Reporter {
 public:
  virtual ~Reporter() = default;
  virtual void OnStart(const RunInfo& info) {}
  virtual void OnProgress(const ProgressEvent& event) {}
  virtual void OnEval(const EvalEvent& event) {}
  virtual void OnCheckpoint(const CheckpointEvent& event) {}
  // Human-readable notes (what was loaded, what was dropped and why).
  virtual void OnMessage(const std::string& text) {}
};

struct RunOptions {
  // Resume from the newest complete checkpoint in output.dir/checkpoints
  // (starting fresh when there is none).
  bool resume = false;
  // When it becomes true the run finishes the current step, writes a
  // checkpoint and returns with RunResult::stopped set. May be null.
  const std::atomic<bool>* stop = nullptr;
  // A Chrome trace of some training steps (finetune jobs); no path: none.
  ProfileRequest profile;
};

struct RunResult {
  bool stopped = false;      // stopped on request after a checkpoint
  int64_t steps = 0;         // optimizer steps completed
  double final_loss = 0;     // the last step's loss (finetune)
  double eval_loss = 0;      // task eval, or the last eval of a finetune
  int64_t eval_tokens = 0;
  std::string output_path;   // adapter/, model/ or metrics.json written
};

StatusOr<RunResult> RunJob(const JobSpec& spec, const RunOptions& options, Reporter& reporter);

// The CUDA devices this process can use ("cuda:0", "cuda:1", ...), in index
// order; empty when there is no GPU or LibTorch was built without CUDA.
std::vector<std::string> CudaDevices();

}  // namespace trainerd::engine
