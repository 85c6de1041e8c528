// Reports a foreground run: a readable progress line per logged step on
// stdout, notes on stderr, and every figure into output.dir/metrics.jsonl.
#pragma once

#include <string>

#include "engine/engine.h"
#include "worker/metrics_log.h"

namespace trainerd::worker {

// "1:02:03" / "2:03" for a duration in seconds.
std::string FormatDuration(double seconds);
// "812", "8.1k", "1.25M".
std::string FormatCount(double value);
// "step 12/100 | loss 2.3456 | lr 1.00e-04 | grad 0.532 | 8.1k tok/s | 0:12 elapsed | ETA 1:30"
std::string FormatProgress(const engine::ProgressEvent& e);

class ConsoleReporter : public engine::Reporter {
 public:
  explicit ConsoleReporter(std::string output_dir) : output_dir_(std::move(output_dir)) {}
  void OnStart(const engine::RunInfo& info) override;
  void OnProgress(const engine::ProgressEvent& e) override;
  void OnEval(const engine::EvalEvent& e) override;
  void OnCheckpoint(const engine::CheckpointEvent& e) override;
  void OnMessage(const std::string& text) override;
  // Set when metrics.jsonl could not be opened (reported once).
  const Status& metrics_status() const { return metrics_status_; }

 private:
  std::string output_dir_;
  MetricsLog metrics_;
  Status metrics_status_;
};

}  // namespace trainerd::worker
