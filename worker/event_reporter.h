// Reports a run to a supervisor (trainerd) as trainerd.proto.WorkerEvent
// frames (common/framing.h) on an inherited fd: Started, Progress, Eval,
// Checkpoint and log lines as the engine reports them, then one Finished that
// the caller writes when RunJob has returned (or failed before it could start).
//
// Losing the reader must not lose the job: the first failed write (the daemon
// went away: "Broken pipe") is remembered, said once on stderr, and nothing
// more is written; training and the console output go on. Writes never raise
// SIGPIPE (WriteFrame blocks it). The fd is written blocking: a reader that
// stops reading without closing stalls the run once the pipe buffer is full.
//
// This header is protobuf-free; event_reporter.cc uses proto/trainerd.pb.h and
// so must never share a translation unit with torch (shared/gpu/README.md, trap 1).
#pragma once

#include <string>

#include "common/status.h"
#include "engine/engine.h"

namespace trainerd::worker {

class EventReporter : public engine::Reporter {
 public:
  // Writes to `fd`, which the caller keeps open while this reporter is used
  // (and closes, if it wants to, afterwards).
  explicit EventReporter(int fd) : fd_(fd) {}

  void OnStart(const engine::RunInfo& info) override;
  void OnProgress(const engine::ProgressEvent& e) override;
  void OnEval(const engine::EvalEvent& e) override;
  void OnCheckpoint(const engine::CheckpointEvent& e) override;
  void OnMessage(const std::string& text) override;

  // The last event of a run. `error` is empty unless the job failed;
  // `output_path` and `eval_loss` are RunResult's.
  void Finish(bool stopped, const std::string& output_path, double eval_loss, const std::string& error);

  // Ok until a write failed; then that write's error (nothing was written after it).
  const Status& status() const { return status_; }

 private:
  // Sends one serialized WorkerEvent unless an earlier write failed.
  void Send(const std::string& payload);

  int fd_;
  Status status_;
  double last_eval_loss_ = 0;  // carried in every Progress after the first eval
};

}  // namespace trainerd::worker
