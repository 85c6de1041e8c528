#include "worker/console_reporter.h"

#include <cmath>
#include <cstdio>

#include "common/short_count.h"

namespace trainerd::worker {

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%ld:%02ld", s / 60, s % 60);
  }
  return buf;
}

std::string FormatCount(double value) { return ShortCount(value); }

std::string FormatProgress(const engine::ProgressEvent& e) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "step %lld/%lld | loss %.4f | lr %.2e | grad %.3f | %s tok/s | %s elapsed | ETA %s",
                static_cast<long long>(e.step), static_cast<long long>(e.total_steps), e.loss, e.lr, e.grad_norm,
                FormatCount(e.tokens_per_s).c_str(), FormatDuration(e.elapsed_s).c_str(),
                FormatDuration(e.eta_s).c_str());
  std::string line = buf;
  if (e.mfu > 0) {  // a GPU whose peak is known, 16-bit training
    std::snprintf(buf, sizeof(buf), " | MFU %.1f%%", e.mfu * 100);
    line += buf;
  }
  if (e.peak_memory_bytes > 0) {  // on a GPU
    std::snprintf(buf, sizeof(buf), " | peak %.1f GiB", static_cast<double>(e.peak_memory_bytes) / (1 << 30));
    line += buf;
  }
  return line;
}

void ConsoleReporter::OnStart(const engine::RunInfo& info) {
  if (info.total_steps > 0) {  // training; an eval job writes metrics.json only
    metrics_status_ = metrics_.Open(output_dir_, info.resumed_from_step);
    if (!metrics_status_.ok()) std::fprintf(stderr, "warning: %s\n", metrics_status_.message().c_str());
  }
  std::fprintf(stderr, "%s model, %s params (%s trainable) on %s in %s\n", info.model_type.c_str(),
               FormatCount(static_cast<double>(info.total_params)).c_str(),
               FormatCount(static_cast<double>(info.trainable_params)).c_str(), info.device.c_str(),
               info.dtype.c_str());
  if (info.total_steps > 0) {
    std::fprintf(stderr, "%lld training examples (%s tokens, %s trained), %lld steps",
                 static_cast<long long>(info.train_examples),
                 FormatCount(static_cast<double>(info.train_tokens)).c_str(),
                 FormatCount(static_cast<double>(info.trained_tokens)).c_str(),
                 static_cast<long long>(info.total_steps));
    if (info.truncated_examples) {
      std::fprintf(stderr, ", %lld truncated to data.max_seq_len", static_cast<long long>(info.truncated_examples));
    }
    if (info.dropped_examples) {
      std::fprintf(stderr, ", %lld dropped (nothing to train)", static_cast<long long>(info.dropped_examples));
    }
    if (info.resumed_from_step) {
      std::fprintf(stderr, ", resuming after step %lld", static_cast<long long>(info.resumed_from_step));
    }
    std::fprintf(stderr, "\n");
  }
}

void ConsoleReporter::OnProgress(const engine::ProgressEvent& e) {
  std::printf("%s\n", FormatProgress(e).c_str());
  std::fflush(stdout);
  metrics_.Append(e);
}

void ConsoleReporter::OnEval(const engine::EvalEvent& e) {
  std::printf("eval at step %lld | eval_loss %.4f | perplexity %.3f | %lld tokens\n", static_cast<long long>(e.step),
              e.eval_loss, std::exp(e.eval_loss), static_cast<long long>(e.eval_tokens));
  std::fflush(stdout);
  if (e.step > 0) metrics_.Append(e);
}

void ConsoleReporter::OnCheckpoint(const engine::CheckpointEvent& e) {
  std::fprintf(stderr, "checkpoint written: %s\n", e.path.c_str());
}

void ConsoleReporter::OnMessage(const std::string& text) { std::fprintf(stderr, "%s\n", text.c_str()); }

}  // namespace trainerd::worker
