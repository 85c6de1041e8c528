// trainctl's commands, one function each: they print their output on stdout,
// errors on stderr ("trainctl: error: ..."), and return the exit status
// (ctl/exit_codes.h). main.cc parses the command line into these options.
// docs/trainctl.md documents every command for users.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ctl/client.h"
#include "ctl/daemon_call.h"
#include "ctl/job_view.h"

namespace trainerd::ctl {

// What every command gets besides its options.
struct CommandContext {
  // trainerd's socket (client::ResolveSocketPath).
  client::SocketPath socket;
  // How jobs are shown: now, stdout a terminal, colours.
  ViewOptions view;
};

struct SubmitOptions {
  std::string file;
  std::string name;  // empty: trainerd names the job after the file
  int32_t priority = 0;
  bool wait = false;
  bool follow = false;
  bool parsable = false;
};
// Sends the spec file; prints "submitted job 7 (NAME)" (or "7" with
// parsable); with follow streams the job's log until it ends, with wait just
// waits; either then returns the job's outcome as RunWait does.
int RunSubmit(const CommandContext& context, const SubmitOptions& options);

struct ListOptions {
  bool all = false;
  std::vector<std::string> states;  // JobStateNames() values
  bool json = false;
};
int RunList(const CommandContext& context, const ListOptions& options);

struct StatusOptions {
  int64_t job_id = 0;
  bool json = false;
};
int RunStatus(const CommandContext& context, const StatusOptions& options);

struct CancelOptions {
  std::vector<int64_t> job_ids;
};
int RunCancel(const CommandContext& context, const CancelOptions& options);

struct LogsOptions {
  int64_t job_id = 0;
  bool follow = false;
  int32_t tail = 0;  // 0: every line
};
int RunLogs(const CommandContext& context, const LogsOptions& options);

struct WaitOptions {
  int64_t job_id = 0;
  bool quiet = false;  // no "succeeded" line on stdout
};
int RunWait(const CommandContext& context, const WaitOptions& options);

struct ValidateOptions {
  std::string file;
};
// Checks the spec locally with ValidateSubmittedSpec (common/spec_check.h),
// as trainerd would on submit; needs no daemon.
int RunValidate(const CommandContext& context, const ValidateOptions& options);

// The building blocks submit --follow/--wait share with logs and wait, on an
// existing session:
// prints the job's log lines (the last `tail`, 0: all), following until the job ends when `follow`;
int PrintLogs(DaemonSession& session, int64_t job_id, int32_t tail, bool follow);
// waits for the job to end; reports how it ended (stdout when it succeeded,
// unless `quiet`; stderr otherwise) and returns kExitOk or kExitJobFailed.
int WaitForJob(DaemonSession& session, int64_t job_id, bool quiet);

}  // namespace trainerd::ctl
