// JobService: the RequestHandler for trainctl's requests (submit, validate,
// list, status, cancel, logs, wait) over the daemon's JobRegistry.
//
// List is answered from the registry's memory; status too, plus the spec's
// text read from the store. Submit validates
// the spec (common/spec_check.h), stores the job and writes its folder
// <state_dir>/jobs/<id>/: job.yaml (the spec as submitted, written
// atomically), log, and output/ unless the spec sets output.dir. Running jobs
// are stopped through the `stop_running` hook (the supervisor).
//
// Streamed answers: LogsRequest{follow} sends the log's tail and then each new
// line (daemon/job_logs.h) until the job ends; WaitRequest answers once the job
// has ended. Both end when the connection closes.
//
// Threading: like every RequestHandler, on the server's io_context thread.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"
#include "daemon/job_logs.h"
#include "daemon/job_registry.h"
#include "daemon/request_handler.h"
#include "proto/trainerd.pb.h"

namespace trainerd::daemon {

// The parsed spec's main fields as a JSON object (JobRecord::spec_json).
std::string SpecToJson(const JobSpec& spec);

class JobService : public RequestHandler {
 public:
  using Clock = std::function<int64_t()>;  // now, in Unix milliseconds

  struct Hooks {
    // A job was queued: start what can start. May be empty.
    std::function<void()> job_queued;
    // Stop running job `id`'s worker; it then ends cancelled with `reason`.
    // Empty: cancelling a running job is an error.
    std::function<Status(int64_t id, const std::string& reason)> stop_running;
  };

  // `jobs` and `logs` must outlive the service. `now_unix_ms` empty: the system clock.
  JobService(JobRegistry& jobs, JobLogs& logs, std::string state_dir, Clock now_unix_ms = {}, Hooks hooks = {});

  void Handle(const proto::Request& request, const PeerCredentials& peer, ReplyWriter& writer) override;

  // The single Reply for a request answered at once (all but logs --follow and
  // wait). Errors carry a code and a message for the user.
  proto::Reply Answer(const proto::Request& request, const PeerCredentials& peer);

  // The registry calls this after a job's state changed: ends the waits and
  // log follows of a job that has ended.
  void OnJobChanged(const JobRecord& job);

  // <state_dir>/jobs/<id>
  std::string JobDir(int64_t id) const;

 private:
  proto::Reply Submit(const proto::SubmitRequest& request, const PeerCredentials& peer);
  proto::Reply Validate(const proto::ValidateRequest& request);
  // One page of the jobs a ListRequest selects (and the next page's after_id,
  // 0 when none), or why the request is bad.
  struct ListPage {
    std::vector<const JobRecord*> jobs;
    int64_t next_after_id = 0;
  };
  StatusOr<ListPage> Listed(const proto::ListRequest& request) const;
  // A job as a ListReply shows it: no spec (not even its source), the reason's first line.
  static void ListedJob(const JobRecord& job, proto::Job* out);
  void List(const proto::ListRequest& request, proto::Reply* reply);
  // The same Reply, serialized, from each ended job's bytes serialized once
  // (a list of 10,000 jobs is then mostly copying; see docs/benchmarks.md).
  std::string SerializedList(const proto::ListRequest& request);
  proto::Reply StatusOf(const proto::StatusRequest& request);
  proto::Reply Cancel(const proto::CancelRequest& request, const PeerCredentials& peer);
  proto::Reply Logs(const proto::LogsRequest& request);
  void FollowLogs(const proto::LogsRequest& request, ReplyWriter& writer);
  void Wait(const proto::WaitRequest& request, ReplyWriter& writer);

  JobRegistry& jobs_;
  JobLogs& logs_;
  std::string state_dir_;
  Clock now_unix_ms_;
  Hooks hooks_;
  std::map<int64_t, std::list<ReplyWriter>> waiters_;
  std::unordered_map<int64_t, std::string> ended_job_bytes_;  // ListedJob of ended jobs, serialized
};

}  // namespace trainerd::daemon
