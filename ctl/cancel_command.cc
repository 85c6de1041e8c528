// trainctl cancel JOB...
#include <cstdio>
#include <set>

#include "ctl/commands.h"
#include "ctl/exit_codes.h"

namespace trainerd::ctl {

int RunCancel(const CommandContext& context, const CancelOptions& options) {
  proto::Request request;
  for (int64_t id : options.job_ids) request.mutable_cancel()->add_job_ids(id);

  DaemonSession session(context.socket);
  std::optional<proto::Reply> reply = session.Call(request);
  if (!reply) return session.exit_code();

  // trainerd cancels all the jobs asked for or none (it answers an error);
  // a running job is being stopped when this returns.
  const std::set<int64_t> cancelled(reply->cancel().cancelled().begin(), reply->cancel().cancelled().end());
  for (int64_t id : cancelled) std::printf("cancelled job %lld\n", static_cast<long long>(id));
  int exit_code = kExitOk;
  std::set<int64_t> reported;
  for (int64_t id : options.job_ids) {
    if (cancelled.count(id) != 0 || !reported.insert(id).second) continue;
    exit_code = ReportError(kExitRejected,
                            "job " + std::to_string(id) + " was not cancelled (trainerd did not say why)");
  }
  return exit_code;
}

}  // namespace trainerd::ctl
