#include "ctl/job_json.h"

#include <cmath>

#include "ctl/format.h"

namespace trainerd::ctl {
namespace {

using nlohmann::ordered_json;

// A double, or null when JSON cannot hold it (NaN, infinity).
ordered_json Number(double value) {
  if (!std::isfinite(value)) return nullptr;
  return value;
}

}  // namespace

ordered_json ProgressToJson(const proto::Progress& p) {
  ordered_json j = ordered_json::object();
  j["step"] = p.step();
  j["total_steps"] = p.total_steps();
  j["epoch"] = Number(p.epoch());
  j["loss"] = Number(p.loss());
  j["learning_rate"] = Number(p.learning_rate());
  j["grad_norm"] = Number(p.grad_norm());
  j["tokens_per_second"] = Number(p.tokens_per_second());
  j["mfu"] = Number(p.mfu());
  j["peak_memory_bytes"] = p.peak_memory_bytes();
  j["elapsed_seconds"] = Number(p.elapsed_seconds());
  j["eta_seconds"] = Number(p.eta_seconds());
  j["eval_loss"] = Number(p.eval_loss());
  return j;
}

ordered_json ResultToJson(const proto::JobResult& r) {
  ordered_json j = ordered_json::object();
  j["exit_code"] = r.exit_code();
  j["signal"] = r.signal();
  j["output_path"] = r.output_path();
  j["eval_loss"] = Number(r.eval_loss());
  return j;
}

ordered_json JobToJson(const proto::Job& job, const std::string& owner, bool with_spec) {
  ordered_json j = ordered_json::object();
  j["id"] = job.id();
  j["name"] = job.name();
  j["owner_uid"] = job.owner_uid();
  j["owner"] = owner;
  j["state"] = JobStateName(static_cast<int>(job.state()));
  j["priority"] = job.priority();
  j["submitted_unix_ms"] = job.submitted_unix_ms();
  j["started_unix_ms"] = job.started_unix_ms();
  j["finished_unix_ms"] = job.finished_unix_ms();
  j["attempt"] = job.attempt();
  j["device"] = job.device();
  j["output_dir"] = job.output_dir();
  j["reason"] = job.reason();
  j["progress"] = ProgressToJson(job.progress());
  j["result"] = ResultToJson(job.result());
  if (with_spec) {
    ordered_json spec = ordered_json::object();
    spec["source"] = job.spec().source();
    spec["base_dir"] = job.spec().base_dir();
    spec["yaml"] = job.spec().yaml();
    j["spec"] = std::move(spec);
  }
  return j;
}

std::string DumpJson(const ordered_json& value) {
  return value.dump(2, ' ', /*ensure_ascii=*/false, ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace trainerd::ctl
