// trainctl wait JOB
#include <cstdio>

#include "ctl/commands.h"
#include "ctl/exit_codes.h"
#include "ctl/format.h"

namespace trainerd::ctl {
namespace {

// "job 7 (NAME)", or "job 7" for a job without a name.
std::string JobLabel(const proto::Job& job) {
  std::string label = "job " + std::to_string(job.id());
  if (!job.name().empty()) label += " (" + job.name() + ")";
  return label;
}

// How the worker ended, for a failed job: " (exit code 1)", " (killed by SIGKILL)", or "".
std::string WorkerExit(const proto::JobResult& result) {
  if (result.signal() != 0) return " (worker killed by " + SignalName(result.signal()) + ")";
  if (result.exit_code() != 0) return " (worker exit code " + std::to_string(result.exit_code()) + ")";
  return "";
}

}  // namespace

int WaitForJob(DaemonSession& session, int64_t job_id, bool quiet) {
  proto::Request request;
  request.mutable_wait()->set_job_id(job_id);
  // The answer is a stream whose last Reply carries the job as it ended;
  // earlier Replies, if any, are only signs of life.
  std::optional<proto::Reply> last = session.Stream(request, [](const proto::Reply&) {});
  if (!last) return session.exit_code();
  if (!last->has_wait() || !last->wait().has_job()) {
    return session.ProtocolError("trainerd ended the wait for job " + std::to_string(job_id) +
                                 " without saying how the job ended; are trainctl and trainerd the same version?");
  }
  const proto::Job& job = last->wait().job();
  const std::string label = JobLabel(job);
  const std::string reason = job.reason().empty() ? "" : ": " + job.reason();
  std::fflush(stdout);
  switch (job.state()) {
    case proto::JOB_STATE_SUCCEEDED: {
      if (!quiet) {
        std::string line = label + " succeeded";
        if (job.progress().elapsed_seconds() > 0) line += " in " + FormatDuration(job.progress().elapsed_seconds());
        const std::string& output = job.result().output_path().empty() ? job.output_dir() : job.result().output_path();
        if (!output.empty()) line += "; outputs: " + output;
        std::printf("%s\n", line.c_str());
      }
      return kExitOk;
    }
    case proto::JOB_STATE_FAILED:
      std::fprintf(stderr, "trainctl: %s failed%s%s\n", label.c_str(), WorkerExit(job.result()).c_str(),
                   reason.c_str());
      return kExitJobFailed;
    case proto::JOB_STATE_CANCELLED:
      std::fprintf(stderr, "trainctl: %s was cancelled%s\n", label.c_str(), reason.c_str());
      return kExitJobFailed;
    case proto::JOB_STATE_INTERRUPTED:
      std::fprintf(stderr,
                   "trainctl: %s was interrupted%s; it resumes from its last checkpoint when trainerd "
                   "starts again\n",
                   label.c_str(), reason.c_str());
      return kExitJobFailed;
    default:
      return session.ProtocolError("trainerd ended the wait for " + label + " while it is still " +
                                   JobStateName(static_cast<int>(job.state())));
  }
}

int RunWait(const CommandContext& context, const WaitOptions& options) {
  DaemonSession session(context.socket);
  return WaitForJob(session, options.job_id, options.quiet);
}

}  // namespace trainerd::ctl
