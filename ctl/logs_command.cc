// trainctl logs JOB [-f|--follow] [-n|--tail N]
#include <cstdio>

#include "ctl/commands.h"
#include "ctl/exit_codes.h"

namespace trainerd::ctl {
namespace {

// Prints each line's text, adding the newline it lacks. Flushed per Reply, so
// `logs -f | grep` sees lines as they come.
void PrintLines(const proto::LogsReply& logs) {
  for (const proto::LogLine& line : logs.lines()) {
    const std::string& text = line.text();
    std::fwrite(text.data(), 1, text.size(), stdout);
    if (text.empty() || text.back() != '\n') std::fputc('\n', stdout);
  }
  std::fflush(stdout);
}

}  // namespace

int PrintLogs(DaemonSession& session, int64_t job_id, int32_t tail, bool follow) {
  proto::Request request;
  proto::LogsRequest* logs = request.mutable_logs();
  logs->set_job_id(job_id);
  logs->set_tail(tail);
  logs->set_follow(follow);
  if (!follow) {
    std::optional<proto::Reply> reply = session.Call(request);
    if (!reply) return session.exit_code();
    PrintLines(reply->logs());
    return kExitOk;
  }
  // Ends when trainerd ends the stream: the job has ended.
  std::optional<proto::Reply> last =
      session.Stream(request, [](const proto::Reply& reply) { PrintLines(reply.logs()); });
  return last ? kExitOk : session.exit_code();
}

int RunLogs(const CommandContext& context, const LogsOptions& options) {
  DaemonSession session(context.socket);
  return PrintLogs(session, options.job_id, options.tail, options.follow);
}

}  // namespace trainerd::ctl
