// trainctl submit FILE [--name N] [--priority P] [--wait] [--follow] [--parsable]
#include <cstdio>
#include <filesystem>

#include "ctl/commands.h"
#include "ctl/exit_codes.h"
#include "ctl/spec_file.h"

namespace trainerd::ctl {

int RunSubmit(const CommandContext& context, const SubmitOptions& options) {
  StatusOr<proto::JobSpec> spec = ReadSpecFile(options.file);
  if (!spec.ok()) return ReportError(kExitUsage, spec.status().message());

  proto::Request request;
  proto::SubmitRequest* submit = request.mutable_submit();
  *submit->mutable_spec() = std::move(spec).value();
  submit->set_name(options.name);
  submit->set_priority(options.priority);

  DaemonSession session(context.socket);
  std::optional<proto::Reply> reply = session.Call(request);
  if (!reply) return session.exit_code();
  const int64_t id = reply->submit().job_id();
  if (id <= 0) return session.ProtocolError("trainerd accepted the job but sent no job id");

  if (options.parsable) {
    std::printf("%lld\n", static_cast<long long>(id));
  } else {
    const std::string& name = reply->submit().name();
    std::printf("submitted job %lld (%s)\n", static_cast<long long>(id), name.c_str());
  }
  std::fflush(stdout);

  if (options.follow) {
    const int logs = PrintLogs(session, id, /*tail=*/0, /*follow=*/true);
    if (logs != kExitOk) return logs;
    return WaitForJob(session, id, /*quiet=*/options.parsable);
  }
  if (options.wait) return WaitForJob(session, id, /*quiet=*/options.parsable);
  return kExitOk;
}

}  // namespace trainerd::ctl
