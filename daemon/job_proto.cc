#include "daemon/job_proto.h"

namespace trainerd::daemon {

void JobToProto(const JobRecord& job, proto::Job* out) {
  out->set_id(job.id);
  out->set_name(job.name);
  out->set_owner_uid(job.owner_uid);
  out->set_state(static_cast<proto::JobState>(job.state));  // same numbers by design
  out->set_priority(job.priority);
  out->set_submitted_unix_ms(job.submitted_unix_ms);
  out->set_started_unix_ms(job.started_unix_ms);
  out->set_finished_unix_ms(job.finished_unix_ms);
  out->set_attempt(job.attempt);
  proto::Progress* p = out->mutable_progress();
  p->set_step(job.progress.step);
  p->set_total_steps(job.progress.total_steps);
  p->set_epoch(job.progress.epoch);
  p->set_loss(job.progress.loss);
  p->set_learning_rate(job.progress.learning_rate);
  p->set_grad_norm(job.progress.grad_norm);
  p->set_tokens_per_second(job.progress.tokens_per_second);
  p->set_mfu(job.progress.mfu);
  p->set_peak_memory_bytes(job.progress.peak_memory_bytes);
  p->set_elapsed_seconds(job.progress.elapsed_seconds);
  p->set_eta_seconds(job.progress.eta_seconds);
  p->set_eval_loss(job.progress.eval_loss);
  proto::JobResult* r = out->mutable_result();
  r->set_exit_code(job.result.exit_code);
  r->set_signal(job.result.signal);
  r->set_output_path(job.result.output_path);
  r->set_eval_loss(job.result.eval_loss);
  out->set_reason(job.reason);
  out->set_output_dir(job.output_dir);
  out->set_device(job.device);
  if (!job.spec_yaml.empty() || !job.spec_source.empty() || !job.spec_base_dir.empty()) {
    proto::JobSpec* s = out->mutable_spec();
    s->set_yaml(job.spec_yaml);
    s->set_source(job.spec_source);
    s->set_base_dir(job.spec_base_dir);
  }
}

proto::Job JobToProto(const JobRecord& job) {
  proto::Job out;
  JobToProto(job, &out);
  return out;
}

JobRecord JobFromProto(const proto::Job& job) {
  JobRecord out;
  out.id = job.id();
  out.name = job.name();
  out.owner_uid = job.owner_uid();
  int state = static_cast<int>(job.state());
  out.state = state >= static_cast<int>(JobState::kQueued) &&
                      state <= static_cast<int>(JobState::kInterrupted)
                  ? static_cast<JobState>(state)
                  : JobState::kQueued;
  out.priority = job.priority();
  out.submitted_unix_ms = job.submitted_unix_ms();
  out.started_unix_ms = job.started_unix_ms();
  out.finished_unix_ms = job.finished_unix_ms();
  out.attempt = job.attempt();
  const proto::Progress& p = job.progress();
  out.progress.step = p.step();
  out.progress.total_steps = p.total_steps();
  out.progress.epoch = p.epoch();
  out.progress.loss = p.loss();
  out.progress.learning_rate = p.learning_rate();
  out.progress.grad_norm = p.grad_norm();
  out.progress.tokens_per_second = p.tokens_per_second();
  out.progress.mfu = p.mfu();
  out.progress.peak_memory_bytes = p.peak_memory_bytes();
  out.progress.elapsed_seconds = p.elapsed_seconds();
  out.progress.eta_seconds = p.eta_seconds();
  out.progress.eval_loss = p.eval_loss();
  out.result.exit_code = job.result().exit_code();
  out.result.signal = job.result().signal();
  out.result.output_path = job.result().output_path();
  out.result.eval_loss = job.result().eval_loss();
  out.reason = job.reason();
  out.output_dir = job.output_dir();
  out.device = job.device();
  out.spec_yaml = job.spec().yaml();
  out.spec_source = job.spec().source();
  out.spec_base_dir = job.spec().base_dir();
  return out;
}

}  // namespace trainerd::daemon
