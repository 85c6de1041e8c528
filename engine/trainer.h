// The training loop: micro-batches, gradient accumulation, AdamW with a
// warmup schedule, clipping, periodic eval and checkpoints, exact resume.
//
// The data is one stream of examples: epoch e is the training set in the
// order of a permutation seeded by (training.seed, e) (file order when
// data.shuffle is false), and epochs follow each other without a break, so a
// micro-batch may hold the end of one epoch and the start of the next. An
// optimizer step takes micro_batch_size * gradient_accumulation_steps
// consecutive examples; its loss is the sum of their token losses divided by
// their target-token count, and that is what is differentiated.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/job_spec.h"
#include "engine/checkpoint.h"
#include "engine/engine.h"
#include "engine/fused_adamw.h"
#include "engine/llama_model.h"
#include "engine/step_readback.h"
#include "engine/token_dataset.h"

namespace trainerd::engine {

struct EvalResult {
  double loss = 0;     // mean over target tokens
  int64_t tokens = 0;  // target tokens
};

// Mean token loss of a data set, batched by EvaluationBatches, with the model
// in eval mode (no dropout) and no gradients.
EvalResult Evaluate(LlamaModel& model, const TokenDataset& data, int64_t batch_size, int64_t row_tokens = 0);

// Evaluation's micro-batches: every example once, longest first (ties in file
// order), so that a batch pads its rows to lengths close to their own. A
// batch's padded tokens (its rows times its first, longest row's length) stay
// within batch_size (> 0) rows of row_tokens: what a training micro-batch of
// that size holds at that length (the trainer passes its longest training
// example, the length `micro_batch_size: auto` sized the micro-batch for);
// row_tokens 0 takes the set's own longest, so that the first batch holds
// batch_size examples. A row longer than that budget goes alone. So short
// examples are not evaluated a few at a time, and no batch asks more memory
// than the budget: n rows of length l with n * l within it also keep
// attention's n * l * l within the budget times the longest row. A batch
// holds at most max(batch_size, kMaxEvaluationRows) rows: an attention kernel
// may put rows x heads on one grid dimension (65,535 at most), under that at
// 256 rows for up to 255 heads. The loss is a sum over tokens: the batching
// changes only its rounding.
inline constexpr size_t kMaxEvaluationRows = 256;
std::vector<std::vector<const TokenExample*>> EvaluationBatches(const TokenDataset& data, int64_t batch_size,
                                                               int64_t row_tokens = 0);

// Optimizer steps the job runs: training.max_steps when set, else
// ceil(epochs * examples / examples_per_step).
int64_t TotalSteps(const JobSpec::Training& training, int64_t examples);

class Trainer {
 public:
  // `trainable` are the tensors to optimise (requires_grad set), under the
  // names checkpoints store. `eval` may be null. All references must outlive Run.
  Trainer(const JobSpec& spec, LlamaModel& model, NamedTensors trainable, const TokenDataset& train,
          const TokenDataset* eval, Reporter& reporter);

  // Runs the remaining steps (after restoring the newest checkpoint when
  // options.resume). Writes checkpoints; the caller exports the result.
  StatusOr<RunResult> Run(const RunOptions& options);

  int64_t total_steps() const { return total_steps_; }
  // The settings recorded in checkpoints, which a resume must match.
  nlohmann::json JobFingerprint() const;

 private:
  using Clock = std::chrono::steady_clock;
  // A step queued on the device whose loss and gradient norm are read later.
  struct PendingStep {
    int64_t step = 0;  // 1-based; 0: none
    StepReadback scalars;  // loss sum, gradient norm
    int64_t targets = 0, tokens = 0;
    double flops = 0;  // engine/flops.h
    double lr = 0;
    int64_t cursor = 0, tokens_seen = 0;  // after the step
  };
  // The steps since the last progress event. Their time is the device's, from
  // the end of the step that closed the previous window (`previous`, CUDA) to
  // the end of the last step; the host clock from `start` otherwise.
  struct Window {
    Clock::time_point start;
    StepReadback previous;  // not started: the first window, or the CPU
    double loss_sum = 0, flops = 0;
    int64_t targets = 0, tokens = 0;
    // Seconds of evaluation and checkpointing inside the window, left out of
    // its tokens/s and MFU: they are training figures. Both start after the
    // step before them finished (Resolve waits for it) and end synchronised
    // (the eval loss read, the tensors copied out), so their wall time is
    // also the device time they take between two steps' events.
    double paused_s = 0;
  };

  const TokenExample& ExampleAt(int64_t cursor);
  Status Checkpoint(const CheckpointState& state, RunResult& result);
  // Reads a pending step's figures (waiting for it to finish on the device),
  // fails on a non-finite loss, and reports progress when the step is due.
  Status Resolve(PendingStep& pending, Window& window, int64_t first_step, Clock::time_point start,
                 RunResult& result, bool stopping);

  const JobSpec& spec_;
  LlamaModel& model_;
  NamedTensors trainable_;
  const TokenDataset& train_;
  const TokenDataset* eval_;
  int64_t longest_train_ = 0;  // tokens of the longest training example: evaluation's row length
  Reporter& reporter_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  int64_t total_steps_ = 0;
  bool full_finetune_ = false;  // base weights trained: 6N FLOPs per token, not 4N
  double peak_flops_ = 0;       // the GPU's bf16 peak (engine/flops.h); 0: no MFU
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;  // permutation of the current epoch
};

}  // namespace trainerd::engine
