// trainctl list [--all] [--state S]... [--json]
#include <cstdio>
#include <utility>
#include <vector>

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

  // Page by page (trainerd sends at most 10,000 jobs per reply), on one connection.
  DaemonSession session(context.socket);
  std::vector<proto::Job> jobs;
  while (true) {
    std::optional<proto::Reply> reply = session.Call(request);
    if (!reply) return session.exit_code();
    proto::ListReply* page = reply->mutable_list();
    for (proto::Job& job : *page->mutable_jobs()) jobs.push_back(std::move(job));
    if (page->next_after_id() <= list->after_id()) break;  // the last page (or a daemon that does not page)
    list->set_after_id(page->next_after_id());
  }

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
  std::fputs(RenderJobTable(jobs, context.view).c_str(), stdout);
  return kExitOk;
}

}  // namespace trainerd::ctl
