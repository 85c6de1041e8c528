#include "worker/event_reporter.h"

#include <cstdio>
#include <string_view>

#include "common/proto_framing.h"
#include "engine/tokenizer/utf8.h"
#include "proto/trainerd.pb.h"

namespace trainerd::worker {
namespace {

// The longest text (log line, error) sent in one event; the console has it whole.
constexpr size_t kMaxTextBytes = 64 << 10;

// Text for a proto3 `string` field: at most kMaxTextBytes and valid UTF-8
// (file names and data can hold any bytes; a receiver refuses a message whose
// string fields are not UTF-8).
std::string EventText(std::string_view text) {
  if (text.size() > kMaxTextBytes) text = text.substr(0, kMaxTextBytes);
  if (engine::tokenizer::FindInvalidUtf8(text) == std::string_view::npos) return std::string(text);
  return engine::tokenizer::Utf8Lossy(text);  // also mends a sequence cut by the limit
}

}  // namespace

void EventReporter::Send(const std::string& payload) {
  if (!status_.ok()) return;
  Status s = WriteFrame(fd_, payload);
  if (s.ok()) return;
  status_ = s.WithContext("writing events to fd " + std::to_string(fd_));
  std::fprintf(stderr, "warning: %s; the job goes on without sending events\n", status_.message().c_str());
}

void EventReporter::OnStart(const engine::RunInfo& info) {
  proto::WorkerEvent event;
  proto::WorkerEvent::Started* started = event.mutable_started();
  started->set_device(EventText(info.device));
  started->set_dtype(EventText(info.dtype));
  started->set_total_steps(info.total_steps);
  started->set_resumed_from_step(info.resumed_from_step);
  started->set_train_examples(info.train_examples);
  started->set_train_tokens(info.train_tokens);
  started->set_trained_tokens(info.trained_tokens);
  Send(Serialize(event));
}

void EventReporter::OnProgress(const engine::ProgressEvent& e) {
  proto::WorkerEvent event;
  proto::Progress* progress = event.mutable_progress();
  progress->set_step(e.step);
  progress->set_total_steps(e.total_steps);
  progress->set_epoch(e.epoch);
  progress->set_loss(e.loss);
  progress->set_learning_rate(e.lr);
  progress->set_grad_norm(e.grad_norm);
  progress->set_tokens_per_second(e.tokens_per_s);
  progress->set_mfu(e.mfu);
  progress->set_peak_memory_bytes(e.peak_memory_bytes);
  progress->set_elapsed_seconds(e.elapsed_s);
  progress->set_eta_seconds(e.eta_s);
  progress->set_eval_loss(last_eval_loss_);
  Send(Serialize(event));
}

void EventReporter::OnEval(const engine::EvalEvent& e) {
  last_eval_loss_ = e.eval_loss;
  proto::WorkerEvent event;
  proto::WorkerEvent::Eval* eval = event.mutable_eval();
  eval->set_step(e.step);
  eval->set_eval_loss(e.eval_loss);
  eval->set_eval_tokens(e.eval_tokens);
  Send(Serialize(event));
}

void EventReporter::OnCheckpoint(const engine::CheckpointEvent& e) {
  proto::WorkerEvent event;
  proto::WorkerEvent::Checkpoint* checkpoint = event.mutable_checkpoint();
  checkpoint->set_step(e.step);
  checkpoint->set_path(EventText(e.path));
  Send(Serialize(event));
}

void EventReporter::OnMessage(const std::string& text) {
  proto::WorkerEvent event;
  event.set_log_line(EventText(text));
  Send(Serialize(event));
}

void EventReporter::Finish(bool stopped, const std::string& output_path, double eval_loss,
                           const std::string& error) {
  proto::WorkerEvent event;
  proto::WorkerEvent::Finished* finished = event.mutable_finished();
  finished->set_stopped(stopped);
  finished->set_output_path(EventText(output_path));
  finished->set_eval_loss(eval_loss);
  finished->set_error(EventText(error));
  Send(Serialize(event));
}

}  // namespace trainerd::worker
