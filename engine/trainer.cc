#include "engine/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>

#include "engine/batch.h"
#include "engine/device_memory.h"
#include "engine/durable_files.h"
#include "engine/epilogue_gemm.h"
#include "engine/flops.h"
#include "engine/hopper_attention.h"
#include "engine/lr_schedule.h"
#include "engine/step_graph.h"

namespace trainerd::engine {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Where passes went into the Hopper GEMM's epilogues in a step, from the
// products counted before it: a measurement at TRAINERD_HOPPER_GEMM 1 or 2,
// or with TRAINERD_HOPPER_ROPE=1, must say whether the GEMM took them (it
// declines products it does not suit).
std::string EpilogueGemmNote(const EpilogueGemmCounts& before, int level, bool rope, bool down_lora) {
  const EpilogueGemmCounts now = EpilogueGemmRuns();
  auto origin = [](bool automatic) { return automatic ? " (the default here)" : ""; };
  std::string settings, ran;
  if (level >= 1) {
    settings = "TRAINERD_HOPPER_GEMM=" + std::to_string(level) + origin(SwiGluGemmLevelIsAutomatic());
    ran = "SwiGLU's forward in " + std::to_string(now.forward - before.forward) + " gate|up products";
    if (level >= 2) ran += " and its backward in " + std::to_string(now.backward - before.backward) + " down products";
    if (down_lora) {
      settings += ", TRAINERD_HOPPER_DOWN_LORA=1";
      ran += ", down's LoRA product over h in " + std::to_string(now.down_lora - before.down_lora) +
             " gate|up products";
    }
  }
  if (rope) {
    settings += std::string(settings.empty() ? "" : ", ") + "TRAINERD_HOPPER_ROPE=1" + origin(RopeGemmIsAutomatic());
    ran += std::string(ran.empty() ? "" : ", and ") + "the rotary embedding in " +
           std::to_string(now.rope - before.rope) + " q|k|v products";
  }
  return settings + ": the first step ran " + ran +
         " of the Hopper GEMM (launches; the others declined it for their shape, dtype or device and ran cuBLAS and "
         "the pass: engine/epilogue_gemm.h)";
}

// splitmix64: a small, fully specified generator, so that an epoch's order is
// the same on every platform and library version.
uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Weight decay applies to weight matrices and LoRA matrices, not to norms or
// biases (Hugging Face Trainer's rule).
bool DecaysWeight(const std::string& name) {
  if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) return false;
  return name.find("norm.weight") == std::string::npos && name.find("layernorm") == std::string::npos;
}

// The global L2 norm of the gradients as a 0-dim float32 tensor, and, when
// max_norm > 0, the gradients scaled by min(1, max_norm / (norm + 1e-6)) (what
// torch's clip_grad_norm_ does), all on the device: no host synchronisation.
torch::Tensor GradientNorm(const std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return torch::zeros({}, torch::kFloat32);
  std::vector<torch::Tensor> norms = at::_foreach_norm(grads, 2);
  for (auto& n : norms) n = n.to(torch::kFloat32);
  torch::Tensor total = torch::stack(norms).norm();
  if (max_norm > 0) {
    torch::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
    for (auto& g : grads) g.mul_(coef.to(g.scalar_type()));
  }
  return total;
}

// The forward and backward passes of one optimizer step's micro-batches: the
// gradients accumulated into the parameters' .grad, the loss sum returned
// (0-dim float32). `targets`, the step's target count, is a 0-dim float32
// tensor on the model's device, so that a CUDA graph of a micro-batch's pass
// serves every step (engine/step_graph.h).
torch::Tensor ForwardBackward(const LlamaModel& model, const std::vector<Batch>& micro, const torch::Tensor& targets) {
  torch::Tensor loss_sum = torch::zeros({}, targets.options());
  for (const Batch& batch : micro) {
    torch::Tensor loss = CausalLmLossSum(model, batch);
    (loss / targets).backward();
    loss_sum.add_(loss.detach());
  }
  return loss_sum;
}

}  // namespace

EvalResult Evaluate(LlamaModel& model, const TokenDataset& data, int64_t batch_size, int64_t row_tokens) {
  torch::NoGradGuard no_grad;
  const bool was_training = model.training();
  model.set_training(false);
  torch::Tensor sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(model.device()));
  EvalResult result;
  for (const std::vector<const TokenExample*>& chunk : EvaluationBatches(data, batch_size, row_tokens)) {
    Batch batch = MakeBatch(chunk, model.device());
    sum.add_(CausalLmLossSum(model, batch));  // read once at the end: no sync per batch
    result.tokens += batch.target_tokens;
  }
  model.set_training(was_training);
  result.loss = result.tokens > 0 ? sum.item<double>() / static_cast<double>(result.tokens) : 0.0;
  return result;
}

std::vector<std::vector<const TokenExample*>> EvaluationBatches(const TokenDataset& data, int64_t batch_size,
                                                               int64_t row_tokens) {
  TORCH_CHECK(batch_size > 0 && row_tokens >= 0, "EvaluationBatches: batch_size must be positive and row_tokens not "
              "negative, got ", batch_size, " and ", row_tokens);
  std::vector<const TokenExample*> order;
  order.reserve(data.examples.size());
  for (const TokenExample& e : data.examples) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const TokenExample* a, const TokenExample* b) {
    return a->input_ids.size() > b->input_ids.size();
  });
  std::vector<std::vector<const TokenExample*>> batches;
  if (order.empty()) return batches;
  // A batch's padded tokens are its count times its first (longest) example's length.
  const size_t row = row_tokens > 0 ? static_cast<size_t>(row_tokens) : order.front()->input_ids.size();
  const size_t budget = static_cast<size_t>(batch_size) * std::max<size_t>(1, row);
  const size_t max_rows = std::max<size_t>(static_cast<size_t>(batch_size), kMaxEvaluationRows);
  for (size_t start = 0; start < order.size();) {
    const size_t longest = std::max<size_t>(1, order[start]->input_ids.size());
    const size_t rows = std::min(max_rows, std::max<size_t>(1, budget / longest));
    const size_t end = std::min(order.size(), start + rows);
    batches.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(start),
                         order.begin() + static_cast<std::ptrdiff_t>(end));
    start = end;
  }
  return batches;
}

int64_t TotalSteps(const JobSpec::Training& training, int64_t examples) {
  if (training.max_steps > 0) return training.max_steps;
  const double per_step = static_cast<double>(training.micro_batch_size * training.gradient_accumulation_steps);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(training.epochs * examples / per_step - 1e-9)));
}

Trainer::Trainer(const JobSpec& spec, LlamaModel& model, NamedTensors trainable, const TokenDataset& train,
                 const TokenDataset* eval, Reporter& reporter)
    : spec_(spec), model_(model), trainable_(std::move(trainable)), train_(train), eval_(eval), reporter_(reporter) {
  const auto& t = spec_.training;
  total_steps_ = TotalSteps(t, static_cast<int64_t>(train_.examples.size()));
  if (const TokenExample* longest = train_.Longest()) {
    longest_train_ = static_cast<int64_t>(longest->input_ids.size());  // the example auto's probe sized for
  }
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& [name, tensor] : trainable_) (DecaysWeight(name) ? decay : no_decay).push_back(tensor);
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(t.learning_rate)
            .betas(std::make_tuple(t.adam_beta1, t.adam_beta2))
            .eps(t.adam_epsilon)
            .weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) groups.emplace_back(decay, options(t.weight_decay));
  if (!no_decay.empty()) groups.emplace_back(no_decay, options(0.0));
  optimizer_ = std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(t.learning_rate));
  full_finetune_ = !spec_.adapter.has_value();
  // MFU against the bf16 tensor-core peak only where the job computes in a
  // 16-bit type (a float32 job's ceiling is another one).
  if (model_.dtype() == torch::kBFloat16 || model_.dtype() == torch::kFloat16) {
    peak_flops_ = PeakBf16Flops(DeviceModelName(model_.device()));
  }
}

Status Trainer::Resolve(PendingStep& p, Window& w, int64_t first_step, Clock::time_point start, RunResult& result,
                        bool stopping) {
  const std::vector<double> values = p.scalars.Wait();  // {loss sum, gradient norm}
  const double loss = values[0] / static_cast<double>(p.targets);
  if (!std::isfinite(loss)) {
    return Status::Error("step " + std::to_string(p.step) + ": the loss is " + (std::isnan(loss) ? "NaN" : "infinite") +
                         "; training stopped and no adapter or model was written. Lower training.learning_rate, "
                         "set training.max_grad_norm, or use model.dtype float32/bfloat16 instead of float16");
  }
  result.final_loss = loss;
  w.loss_sum += values[0];
  w.targets += p.targets;
  w.tokens += p.tokens;
  w.flops += p.flops;
  if (p.step % spec_.training.log_every != 0 && p.step != total_steps_ && !stopping) return Status::Ok();
  ProgressEvent e;
  e.step = p.step;
  e.total_steps = total_steps_;
  e.epoch = static_cast<double>(p.cursor) / static_cast<double>(train_.examples.size());
  e.loss = w.loss_sum / static_cast<double>(w.targets);
  e.lr = p.lr;
  e.grad_norm = values[1];
  e.tokens = p.tokens_seen;
  const double measured_s = w.previous.started()
                                ? StepReadback::SecondsBetween(w.previous, p.scalars).value_or(Seconds(w.start))
                                : Seconds(w.start);
  const double window_s = std::max(0.0, measured_s - w.paused_s);
  e.tokens_per_s = window_s > 0 ? static_cast<double>(w.tokens) / window_s : 0;
  e.mfu = peak_flops_ > 0 && window_s > 0 ? w.flops / window_s / peak_flops_ : 0;
  e.elapsed_s = Seconds(start);
  e.eta_s = e.elapsed_s / static_cast<double>(p.step - first_step) * static_cast<double>(total_steps_ - p.step);
  e.peak_memory_bytes = PeakMemoryBytes(model_.device());
  reporter_.OnProgress(e);
  Window next;
  next.start = Clock::now();
  next.previous = std::move(p.scalars);
  w = std::move(next);
  return Status::Ok();
}

nlohmann::json Trainer::JobFingerprint() const {
  const auto& t = spec_.training;
  nlohmann::json j = {
      {"model.path", spec_.model.path}, {"data.train", spec_.data.train},
      {"data.max_seq_len", spec_.data.max_seq_len}, {"data.shuffle", spec_.data.shuffle},
      {"data.format", spec_.data.format}, {"data.packing", spec_.data.packing},
      {"data.train_on_prompt", spec_.data.train_on_prompt},
      {"training.micro_batch_size", t.micro_batch_size},
      {"training.gradient_accumulation_steps", t.gradient_accumulation_steps},
      {"training.seed", t.seed}, {"total_steps", total_steps_}, {"trainable_tensors", trainable_.size()},
  };
  if (spec_.adapter) {
    j["adapter.r"] = spec_.adapter->r;
    j["adapter.target_modules"] = spec_.adapter->target_modules;
  }
  return j;
}

const TokenExample& Trainer::ExampleAt(int64_t cursor) {
  const int64_t n = static_cast<int64_t>(train_.examples.size());
  const int64_t epoch = cursor / n;
  if (epoch != order_epoch_) {
    order_.resize(n);
    for (int64_t i = 0; i < n; ++i) order_[i] = i;
    if (spec_.data.shuffle) {
      uint64_t state = spec_.training.seed ^ (0xD1B54A32D192ED03ULL * static_cast<uint64_t>(epoch + 1));
      for (int64_t i = n - 1; i > 0; --i) {
        std::swap(order_[i], order_[SplitMix(state) % static_cast<uint64_t>(i + 1)]);
      }
    }
    order_epoch_ = epoch;
  }
  return train_.examples[order_[cursor % n]];
}

Status Trainer::Checkpoint(const CheckpointState& state, RunResult& result) {
  const std::string dir = (fs::path(spec_.output.dir) / "checkpoints").string();
  TRAINERD_ASSIGN_OR_RETURN(std::string path, WriteCheckpoint(dir, state, trainable_, *optimizer_, model_.device(),
                                                              spec_.training.checkpoint_keep));
  reporter_.OnCheckpoint(CheckpointEvent{state.step, path});
  return Status::Ok();
}

StatusOr<RunResult> Trainer::Run(const RunOptions& options) {
  const auto& t = spec_.training;
  RunResult result;
  CheckpointState state;
  state.job = JobFingerprint();
  const std::string checkpoints_dir = (fs::path(spec_.output.dir) / "checkpoints").string();
  if (!options.resume) {
    // A fresh run replaces an earlier run's outputs: its checkpoints must not
    // outrank (and prune) this run's, nor be resumed from later.
    TRAINERD_RETURN_IF_ERROR(RemoveTree(checkpoints_dir).WithContext("clearing the earlier run's checkpoints"));
  } else {
    if (auto latest = FindLatestCheckpoint(checkpoints_dir)) {
      TRAINERD_ASSIGN_OR_RETURN(CheckpointState saved, ReadCheckpoint(*latest, trainable_, *optimizer_, model_.device()));
      for (const auto& [key, value] : state.job.items()) {
        if (!saved.job.contains(key) || saved.job[key] != value) {
          return Status::Error(*latest + " was written by a different job: " + key + " was " +
                               (saved.job.contains(key) ? saved.job[key].dump() : "unset") + ", is " + value.dump() +
                               "; resume with the original spec, or start afresh in another output.dir");
        }
      }
      state = saved;
      reporter_.OnMessage("resuming from " + *latest + " at step " + std::to_string(state.step));
    }
  }
  const LrSchedule schedule = ParseLrSchedule(t.lr_scheduler);
  const int64_t first_step = state.step;
  // Peak memory is the training's: loading the model does not count.
  ResetPeakMemory(model_.device());
  const auto start = Clock::now();
  Window window;
  window.start = start;
  model_.set_training(true);
  FusedAdamW adamw(*optimizer_);
  std::vector<torch::Tensor> params;
  for (const auto& [_, p] : trainable_) params.push_back(p);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(model_.device());
  // Each micro-batch's forward and backward as a CUDA graph of its shape where
  // the job allows (the plan's shapes: every batch takes one, the eager ones
  // included); the graphs' stream is the current one while they live
  // (engine/step_graph.h).
  std::optional<StepGraph> graph;
  StepGraphPlan plan;
  if (t.cuda_graphs && StepGraph::Supported(model_.device())) {
    plan = PlanStepGraph(train_, t.micro_batch_size);
    if (plan.obstacle.empty()) {
      graph.emplace(params, model_.device(), [this](const Batch& batch, const torch::Tensor& count) {
        return ForwardBackward(model_, {batch}, count);
      });
    } else {
      reporter_.OnMessage("each step launches its kernels one by one, without a CUDA graph (training.cuda_graphs): " +
                          plan.obstacle);
    }
  }
  // The step whose loss and gradient norm are still on the device: read while
  // the next step's forward and backward run, so the host never waits for an
  // idle GPU (no synchronisation inside a step).
  PendingStep pending;
  StepProfiler profiler(options.profile);
  const EpilogueGemmCounts epilogue_gemm_before = EpilogueGemmRuns();
  const int epilogue_level = SwiGluGemmLevel(model_.device(), model_.dtype());
  const bool epilogue_rope = RopeGemmEnabled(model_.device(), model_.dtype());
  const bool epilogue_down_lora = DownLoraInGateUpEnabled(model_.device(), model_.dtype());
  const int64_t attention_before = HopperAttentionRuns();

  for (int64_t step = first_step; step < total_steps_; ++step) {
    TRAINERD_RETURN_IF_ERROR(profiler.BeforeStep(step - first_step + 1));
    std::vector<Batch> micro;
    int64_t targets = 0, tokens = 0;
    double squared_lengths = 0;
    for (int64_t a = 0; a < t.gradient_accumulation_steps; ++a) {
      std::vector<const TokenExample*> chunk;
      for (int64_t i = 0; i < t.micro_batch_size; ++i) chunk.push_back(&ExampleAt(state.cursor++));
      micro.push_back(MakeBatch(chunk, model_.device(), graph ? plan.ShapeOf(chunk) : BatchShape{}));
      targets += micro.back().target_tokens;
      tokens += micro.back().input_tokens;
      squared_lengths += micro.back().sum_squared_lengths;
    }
    torch::Tensor loss_sum;
    if (graph) {
      model_.RefreshLoraCopies();  // the graphs read the copies; the optimizer changed the parameters
      graph->BeginStep(targets);
      const int64_t recorded = graph->graphs();
      loss_sum = torch::zeros({}, f32);
      for (const Batch& batch : micro) {
        TRAINERD_ASSIGN_OR_RETURN(const torch::Tensor micro_loss, graph->Run(batch));
        loss_sum.add_(micro_loss);  // before the next micro-batch: a graph's loss is rewritten by its next run
      }
      if (recorded == 0 && graph->graphs() > 0) {
        reporter_.OnMessage("step " + std::to_string(step + 1) +
                            " recorded the run's first CUDA graph (training.cuda_graphs); each later micro-batch of a "
                            "shape seen before replays its shape's graph");
      }
    } else {
      optimizer_->zero_grad();
      loss_sum = ForwardBackward(model_, micro, torch::full({}, static_cast<double>(targets), f32));
    }
    if (pending.step > 0) TRAINERD_RETURN_IF_ERROR(Resolve(pending, window, first_step, start, result, false));
    torch::Tensor grad_norm = GradientNorm(params, t.max_grad_norm);
    const double lr = t.learning_rate * LrMultiplier(schedule, step, t.warmup_steps, total_steps_);
    for (auto& group : optimizer_->param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    adamw.Step(model_.device());
    state.step = step + 1;
    state.tokens_seen += tokens;
    result.steps = state.step;
    pending = PendingStep{};
    pending.step = state.step;
    pending.scalars.Start({loss_sum, grad_norm.to(loss_sum.device())});
    pending.targets = targets;
    pending.tokens = tokens;
    pending.flops = TrainingStepFlops(model_.config(), full_finetune_, static_cast<double>(tokens), squared_lengths);
    pending.lr = lr;
    pending.cursor = state.cursor;
    pending.tokens_seen = state.tokens_seen;

    TRAINERD_RETURN_IF_ERROR(profiler.AfterStep(step - first_step + 1));
    if (step == first_step && (epilogue_level > 0 || epilogue_rope) &&
        (model_.device().is_cuda() || EpilogueGemmSettingsGiven())) {
      reporter_.OnMessage(EpilogueGemmNote(epilogue_gemm_before, epilogue_level, epilogue_rope, epilogue_down_lora));
    }
    // Where the attention kernels of our own ran (the automatic setting: bf16
    // on a Hopper GPU, heads of 128), or were asked for and did not.
    if (step == first_step && HopperAttentionEnabled()) {
      const int64_t attention_runs = HopperAttentionRuns() - attention_before;
      if (attention_runs > 0 || !HopperAttentionIsAutomatic()) {
        reporter_.OnMessage(std::string("TRAINERD_HOPPER_ATTENTION=1") +
                            (HopperAttentionIsAutomatic() ? " (the default here)" : "") +
                            ": the first step ran attention in " + std::to_string(attention_runs) +
                            " forwards of the Hopper attention kernels (the others ran cuDNN's or flash attention; "
                            "TRAINERD_HOPPER_ATTENTION=0 turns them off: engine/hopper_attention.h)");
      }
    }
    const bool last = state.step == total_steps_;
    bool stopping = options.stop && options.stop->load();
    const bool eval_due = eval_ && ((t.eval_every > 0 && state.step % t.eval_every == 0) || last);
    const bool periodic = t.checkpoint_every > 0 && state.step % t.checkpoint_every == 0;
    if (last || stopping || eval_due || periodic) {
      // Everything below reads or writes what this step made: settle it first
      // (a NaN loss must stop the run before a checkpoint keeps it).
      TRAINERD_RETURN_IF_ERROR(Resolve(pending, window, first_step, start, result, stopping));
      pending = PendingStep{};
    }
    const auto paused = Clock::now();
    if (eval_due) {
      EvalResult r = Evaluate(model_, *eval_, t.micro_batch_size, longest_train_);
      model_.set_training(true);
      result.eval_loss = r.loss;
      result.eval_tokens = r.tokens;
      reporter_.OnEval(EvalEvent{state.step, r.loss, r.tokens});
    }
    // A stop raised while this step was being reported also ends the run here.
    stopping = stopping || (options.stop && options.stop->load());
    if ((periodic && !last) || (stopping && !last)) TRAINERD_RETURN_IF_ERROR(Checkpoint(state, result));
    window.paused_s += Seconds(paused);
    if (stopping && !last) {
      result.stopped = true;
      break;
    }
  }
  if (graph && graph->graphs() > 0) {
    reporter_.OnMessage("CUDA graphs ran " + std::to_string(graph->graph_runs()) + " of this run's " +
                        std::to_string(graph->micro_batches()) + " micro-batches (" +
                        std::to_string(graph->graphs()) + (graph->graphs() == 1 ? " graph" : " graphs") +
                        ", one per micro-batch shape)");
  }
  if (!result.stopped) model_.set_training(false);
  return result;
}

}  // namespace trainerd::engine
