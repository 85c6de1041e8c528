// trainctl status JOB [--json]
#include <cstdio>

#include "ctl/commands.h"
#include "ctl/exit_codes.h"
#include "ctl/format.h"
#include "ctl/job_json.h"

namespace trainerd::ctl {

int RunStatus(const CommandContext& context, const StatusOptions& options) {
  proto::Request request;
  request.mutable_status()->set_job_id(options.job_id);

  DaemonSession session(context.socket);
  std::optional<proto::Reply> reply = session.Call(request);
  if (!reply) return session.exit_code();
  const proto::Job& job = reply->status().job();

  if (options.json) {
    std::fputs(DumpJson(JobToJson(job, UserName(job.owner_uid()), /*with_spec=*/true)).c_str(), stdout);
  } else {
    std::fputs(RenderJobStatus(job, context.view).c_str(), stdout);
  }
  return kExitOk;
}

}  // namespace trainerd::ctl
