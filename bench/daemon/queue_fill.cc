#include "bench/daemon/queue_fill.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <system_error>
#include <vector>

#include "common/job_spec.h"
#include "daemon/job_service.h"
#include "daemon/job_store.h"

namespace trainerd::bench {
namespace {

namespace fs = std::filesystem;
using daemon::JobProgress;
using daemon::JobRecord;
using daemon::JobResult;
using daemon::JobState;
using daemon::JobStore;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Format(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

// What happens to an ended job, and the figures it ended with.
enum class Outcome { kSucceeded, kFailedError, kFailedKilled, kCancelledRunning, kCancelledQueued };

struct PlannedJob {
  JobRecord record;  // as Add takes it
  Outcome outcome = Outcome::kSucceeded;
  bool queued = false;
  int64_t started_unix_ms = 0, finished_unix_ms = 0;
  JobProgress progress;
  JobResult result;
  std::string reason;
};

// The worker's progress line (worker/console_reporter.cc), for a failed job's last lines.
std::string ProgressLine(int64_t step, int64_t total, double loss, double lr, double grad) {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "step %" PRId64 "/%" PRId64 " | loss %.4f | lr %.2e | grad %.3f | 4.1k tok/s | 0:%02d:%02d elapsed | ETA 1:%02d:00",
                step, total, loss, lr, grad, static_cast<int>(step / 60 % 60), static_cast<int>(step % 60),
                static_cast<int>(total % 60));
  return buf;
}

class Planner {
 public:
  explicit Planner(const FillOptions& options) : options_(options), rng_(options.seed) {}

  StatusOr<std::vector<PlannedJob>> Plan() {
    std::vector<PlannedJob> jobs;
    jobs.reserve(static_cast<size_t>(options_.jobs));
    // Submissions about every 7 minutes, the newest just now: 10,000 jobs span ~7 weeks.
    const int64_t now = NowUnixMs();
    int64_t submitted = now - options_.jobs * 7 * 60 * 1000;
    for (int64_t id = 1; id <= options_.jobs; ++id) {
      submitted += Uniform(60, 14 * 60) * 1000;
      const bool queued = id > options_.jobs - options_.queued;
      TRAINERD_ASSIGN_OR_RETURN(PlannedJob job, PlanOne(id, std::min(submitted, now), queued));
      jobs.push_back(std::move(job));
    }
    return jobs;
  }

 private:
  int64_t Uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  double Real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }
  template <class T>
  const T& Pick(const std::vector<T>& items) {
    return items[static_cast<size_t>(Uniform(0, static_cast<int64_t>(items.size()) - 1))];
  }

  StatusOr<PlannedJob> PlanOne(int64_t id, int64_t submitted_unix_ms, bool queued) {
    static const std::vector<std::string> kStems = {
        "llama3-8b-sft",     "llama3-8b-chat-lora", "mistral-7b-support", "qwen2-7b-code-lora",
        "llama3-70b-dpo-ref", "tiny-llama-smoke",   "mistral-7b-summarize", "qwen2-1.5b-classify",
        "llama3-8b-tools",   "eval-regression"};
    static const std::vector<int64_t> kSteps = {200, 500, 1000, 2400, 5000};
    static const std::vector<int64_t> kRanks = {4, 8, 16};
    static const std::vector<double> kRates = {1e-4, 2e-4, 5e-4, 1e-3, 3e-3};

    PlannedJob job;
    job.queued = queued;
    const std::string dir = options_.state_dir + "/jobs/" + std::to_string(id);
    FixtureJob spec;
    spec.name = Pick(kStems) + "-v" + std::to_string(Uniform(1, 40));
    spec.fixtures = options_.fixtures;
    spec.output_dir = dir + "/output";
    spec.max_steps = queued ? 1000000 : Pick(kSteps);
    spec.log_every = queued ? options_.log_every : 10;
    spec.lora_r = Pick(kRanks);
    spec.learning_rate = Pick(kRates);
    spec.seed = static_cast<uint64_t>(Uniform(1, 100000));

    JobRecord& r = job.record;
    r.name = spec.name;
    r.owner_uid = queued || Uniform(0, 3) == 0 ? options_.owner_uid : static_cast<uint32_t>(Uniform(1001, 1012));
    r.priority = Uniform(0, 9) == 0 ? 10 : 0;
    r.submitted_unix_ms = submitted_unix_ms;
    r.spec_yaml = FixtureJobYaml(spec);
    r.spec_source = options_.fixtures + "/" + spec.name + ".yaml";
    r.spec_base_dir = options_.fixtures;
    // spec_json as trainerd's submit makes it: the parsed spec (daemon/job_service.h).
    StatusOr<JobSpec> parsed = ParseJobSpecText(r.spec_yaml, r.spec_source, r.spec_base_dir);
    if (!parsed.ok()) return parsed.status().WithContext("the benchmark's job spec does not parse");
    r.spec_json = daemon::SpecToJson(*parsed);
    r.output_dir = spec.output_dir;
    r.log_path = dir + "/log";
    if (queued) return job;

    const double u = Real(0, 1);
    job.outcome = u < 0.80   ? Outcome::kSucceeded
                  : u < 0.89 ? Outcome::kFailedError
                  : u < 0.92 ? Outcome::kFailedKilled
                  : u < 0.96 ? Outcome::kCancelledRunning
                             : Outcome::kCancelledQueued;
    job.started_unix_ms = submitted_unix_ms + Uniform(1, 30 * 60) * 1000;
    const int64_t run_ms = Uniform(3 * 60, 6 * 3600) * 1000;
    job.finished_unix_ms = job.started_unix_ms + run_ms;
    if (job.outcome == Outcome::kCancelledQueued) {
      job.reason = "cancelled by uid " + std::to_string(r.owner_uid);
      return job;
    }

    const int64_t total = spec.max_steps;
    const int64_t step = job.outcome == Outcome::kSucceeded ? total : Uniform(1, total - 1);
    const double loss = Real(0.7, 2.6);
    JobProgress& p = job.progress;
    p.step = step;
    p.total_steps = total;
    p.epoch = static_cast<double>(step) / 5.0;  // ten examples, two a step
    p.loss = loss;
    p.learning_rate = job.outcome == Outcome::kSucceeded ? 0.0 : spec.learning_rate * Real(0.1, 1.0);
    p.grad_norm = Real(0.2, 1.6);
    p.tokens_per_second = Real(3e3, 3e4);
    p.elapsed_seconds = static_cast<double>(run_ms) / 1000.0;
    p.eta_seconds = p.elapsed_seconds * static_cast<double>(total - step) / static_cast<double>(step);
    p.eval_loss = loss + Real(0.0, 0.3);

    JobResult& result = job.result;
    switch (job.outcome) {
      case Outcome::kSucceeded:
        result.output_path = spec.output_dir + "/adapter";
        result.eval_loss = p.eval_loss;
        break;
      case Outcome::kFailedError: {
        static const std::vector<std::string> kErrors = {
            "data.train: line 1841: input_ids[212] = 128257 is not below the model's vocab_size 128256; "
            "check that the data was tokenized for this model",
            "training diverged: the loss is NaN at step {step}; nothing was exported. Lower "
            "training.learning_rate or set training.max_grad_norm",
            "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.11 GiB total capacity; 74.52 GiB "
            "already allocated; 1.21 GiB free); lower training.micro_batch_size or data.max_seq_len",
            "model.path: model.safetensors: tensor model.layers.31.mlp.down_proj.weight: the file ends "
            "after 1,207,959,552 of 1,409,286,144 bytes; copy the model again"};
        result.exit_code = 1;
        job.reason = Pick(kErrors);
        const size_t at = job.reason.find("{step}");
        if (at != std::string::npos) job.reason.replace(at, 6, std::to_string(step));
        break;
      }
      case Outcome::kFailedKilled: {
        result.signal = 9;
        job.reason = "the worker was killed by signal 9 (SIGKILL) (by someone, or by the kernel's "
                     "out-of-memory killer: see `journalctl -k`); its last lines:";
        for (int64_t s = std::max<int64_t>(1, step - 90); s <= step; s += 10) {
          job.reason += "\n  " + ProgressLine(s, total, loss + Real(0, 0.1), p.learning_rate, p.grad_norm);
        }
        break;
      }
      case Outcome::kCancelledRunning:
        result.exit_code = 75;
        job.reason = "cancelled by uid " + std::to_string(r.owner_uid);
        break;
      case Outcome::kCancelledQueued:
        break;
    }
    return job;
  }

  const FillOptions& options_;
  std::mt19937_64 rng_;
};

Status WriteFile(const std::string& path, const std::string& text) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) return Status::Error("creating the folder of " + path + ": " + ec.message());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return Status::Error("writing " + path + " failed");
  return Status::Ok();
}

}  // namespace

std::string FixtureJobYaml(const FixtureJob& job) {
  const std::string r = std::to_string(job.lora_r);
  return "# " + job.name +
         ": a LoRA fine-tune of the tiny Llama test model on its training set.\n"
         "# Written the way users write specs: comments, and the keys they usually set\n"
         "# spelled out even where they equal the defaults (docs/job-spec.md lists them).\n"
         "# Sweep notes: learning rate between 1e-4 and 3e-3, rank 4 to 16, same data.\n"
         "task: finetune\n"
         "model:\n"
         "  path: " + job.fixtures + "/llama/model\n"
         "  dtype: float32            # the CPU has no fast bfloat16\n"
         "adapter:\n"
         "  type: lora\n"
         "  r: " + r + "\n"
         "  alpha: " + std::to_string(2 * job.lora_r) + "\n"
         "  dropout: 0.05\n"
         "  target_modules: [q_proj, k_proj, v_proj, o_proj]\n"
         "data:\n"
         "  train: " + job.fixtures + "/llama/lora_train/train.jsonl\n"
         "  eval: " + job.fixtures + "/llama/eval.jsonl\n"
         "  format: tokens\n"
         "  max_seq_len: 64\n"
         "  shuffle: true\n"
         "training:\n"
         "  max_steps: " + std::to_string(job.max_steps) + "\n"
         "  micro_batch_size: 2\n"
         "  gradient_accumulation_steps: 1\n"
         "  learning_rate: " + Format("%.1e", job.learning_rate) + "\n"
         "  lr_scheduler: cosine\n"
         "  warmup_steps: 10\n"
         "  weight_decay: 0.01\n"
         "  max_grad_norm: 1.0\n"
         "  seed: " + std::to_string(job.seed) + "\n"
         "  eval_every: 0                # evaluate at the end only\n"
         "  checkpoint_every: 0          # trainerd's stop and cancel still checkpoint\n"
         "  log_every: " + std::to_string(job.log_every) + "\n"
         "output:\n"
         "  dir: " + job.output_dir + "\n"
         "device: cpu\n";
}

StatusOr<FillResult> FillQueue(const FillOptions& options) {
  FillResult out;
  const std::string db = options.state_dir + "/queue.db";
  std::error_code ec;
  if (fs::exists(db, ec)) return Status::Error(db + " exists; the benchmark fills a fresh state folder only");

  auto start = Clock::now();
  TRAINERD_ASSIGN_OR_RETURN(std::vector<PlannedJob> jobs, Planner(options).Plan());
  out.prepare_seconds = SecondsSince(start);

  start = Clock::now();
  {
    TRAINERD_ASSIGN_OR_RETURN(JobStore store, JobStore::Open(db));
    for (size_t i = 0; i < jobs.size(); ++i) {
      const PlannedJob& job = jobs[i];
      const int64_t expected_id = static_cast<int64_t>(i) + 1;
      TRAINERD_ASSIGN_OR_RETURN(int64_t id, store.Add(job.record));
      ++out.transactions;
      // The paths in each row name the job's id: a fresh store numbers from 1.
      if (id != expected_id) {
        return Status::Error(db + ": job got id " + std::to_string(id) + ", expected " + std::to_string(expected_id));
      }
      if (job.queued) continue;
      if (job.outcome == Outcome::kCancelledQueued) {
        TRAINERD_RETURN_IF_ERROR(store.Cancel(id, job.reason, job.started_unix_ms));
        ++out.transactions;
        continue;
      }
      TRAINERD_RETURN_IF_ERROR(store.MarkRunning(id, "cpu", job.started_unix_ms));
      TRAINERD_RETURN_IF_ERROR(store.UpdateProgress(id, job.progress));
      const JobState state = job.outcome == Outcome::kSucceeded          ? JobState::kSucceeded
                             : job.outcome == Outcome::kCancelledRunning ? JobState::kCancelled
                                                                         : JobState::kFailed;
      TRAINERD_RETURN_IF_ERROR(store.Finish(id, state, job.result, job.reason, job.finished_unix_ms));
      out.transactions += 3;
    }
  }  // closed: SQLite checkpoints the WAL into queue.db
  out.store_seconds = SecondsSince(start);

  for (size_t i = 0; i < jobs.size(); ++i) {
    const PlannedJob& job = jobs[i];
    out.spec_yaml_bytes += static_cast<int64_t>(job.record.spec_yaml.size());
    const char* state = job.queued ? "queued"
                        : job.outcome == Outcome::kSucceeded
                            ? "succeeded"
                            : (job.outcome == Outcome::kFailedError || job.outcome == Outcome::kFailedKilled)
                                  ? "failed"
                                  : "cancelled";
    ++out.jobs_by_state[state];
    if (job.queued) {
      // What trainerd's submit writes: the worker is started on this file.
      TRAINERD_RETURN_IF_ERROR(
          WriteFile(options.state_dir + "/jobs/" + std::to_string(i + 1) + "/job.yaml", job.record.spec_yaml));
    }
  }
  for (const char* file : {"/queue.db", "/queue.db-wal"}) {
    const auto size = fs::file_size(options.state_dir + file, ec);
    if (!ec) out.queue_db_bytes += static_cast<int64_t>(size);
  }
  return out;
}

}  // namespace trainerd::bench
