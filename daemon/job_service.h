// JobService: the RequestHandler over the JobStore (submit, validate, list,
// status, cancel, logs). The scheduler and the worker supervisor come later:
// until then running jobs are stopped only through the `stop_running`
// callback, and LogsRequest{follow} and WaitRequest are answered with
// ERROR_CODE_INTERNAL ("follow/wait arrive with the supervisor").
//
// Per-job files live in <state_dir>/jobs/<id>/: job.yaml (the spec as
// submitted, written atomically) and log (the job's log, written later by the
// supervisor).
//
// Threading: like every RequestHandler, on the server's io_context thread. The
// store's calls are quick SQLite transactions made on that thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/job_spec.h"
#include "common/status.h"
#include "daemon/job_store.h"
#include "daemon/request_handler.h"
#include "proto/trainerd.pb.h"

namespace trainerd::daemon {

// The checks the spec parser cannot make, as the daemon sees the filesystem:
// model.path is a folder holding a readable config.json, data.train and
// data.eval (when set) are readable regular files. The error names the spec's
// source, the key, the path and what to do.
Status CheckSpecFiles(const JobSpec& spec);

// The parsed spec's main fields as a JSON object (JobRecord::spec_json).
std::string SpecToJson(const JobSpec& spec);

class JobService : public RequestHandler {
 public:
  using Clock = std::function<int64_t()>;  // now, in Unix milliseconds

  // `store` must outlive the service. `now_unix_ms` empty: the system clock.
  // `stop_running` (may be empty) is asked to stop a running job's worker when
  // its owner cancels it; the supervisor then finishes it as cancelled.
  JobService(JobStore& store, std::string state_dir, Clock now_unix_ms = {},
             std::function<void(int64_t)> stop_running = {});

  void Handle(const proto::Request& request, const PeerCredentials& peer,
              ReplyWriter& writer) override;

  // The single Reply for `request` (Handle sends it). Every request is
  // answered at once today; errors carry a code and a message for the user.
  proto::Reply Answer(const proto::Request& request, const PeerCredentials& peer);

  // <state_dir>/jobs/<id>
  std::string JobDir(int64_t id) const;

 private:
  proto::Reply Submit(const proto::SubmitRequest& request, const PeerCredentials& peer);
  proto::Reply Validate(const proto::ValidateRequest& request);
  proto::Reply List(const proto::ListRequest& request);
  proto::Reply StatusOf(const proto::StatusRequest& request);
  proto::Reply Cancel(const proto::CancelRequest& request, const PeerCredentials& peer);
  proto::Reply Logs(const proto::LogsRequest& request);

  // Parses and checks a spec from a request.
  StatusOr<JobSpec> ParseAndCheck(const proto::JobSpec& spec) const;

  JobStore& store_;
  std::string state_dir_;
  Clock now_unix_ms_;
  std::function<void(int64_t)> stop_running_;
};

}  // namespace trainerd::daemon
