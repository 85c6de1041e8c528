// trainctl list [--all] [--state S]... [--json]
#include <cstdio>

#include "ctl/commands.h"
#include "ctl/exit_codes.h"
#include "ctl/format.h"
#include "ctl/job_json.h"

namespace trainerd::ctl {

int RunList(const CommandContext& context, const ListOptions& options) {
  proto::Request request;
  proto::ListRequest* list = request.mutable_list();
  list->set_all(options.all);
  for (const std::string& name : options.states) {
    std::optional<proto::JobState> state = ParseJobStateName(name);
    if (!state) return ReportError(kExitUsage, "--state: unknown state '" + name + "'");
    list->add_states(*state);
  }

  DaemonSession session(context.socket);
  std::optional<proto::Reply> reply = session.Call(request);
  if (!reply) return session.exit_code();
  const auto& jobs = reply->list().jobs();

  if (options.json) {
    nlohmann::ordered_json array = nlohmann::ordered_json::array();
    for (const proto::Job& job : jobs) {
      array.push_back(JobToJson(job, UserName(job.owner_uid()), /*with_spec=*/false));
    }
    std::fputs(DumpJson(array).c_str(), stdout);
    return kExitOk;
  }
  if (jobs.empty() && context.view.terminal) {
    std::puts(options.states.empty() && !options.all
                  ? "no queued, running or interrupted jobs (--all lists ended jobs too)"
                  : "no jobs");
    return kExitOk;
  }
  std::fputs(RenderJobTable({jobs.begin(), jobs.end()}, context.view).c_str(), stdout);
  return kExitOk;
}

}  // namespace trainerd::ctl
