// trainctl: the command-line client of trainerd.
//
//   trainctl [--socket PATH] COMMAND ...   (COMMAND: submit, list, status, cancel, logs, wait, validate)
//
// Parses the command line (CLI11), resolves trainerd's socket and runs one
// command (ctl/commands.h). Exit statuses: ctl/exit_codes.h; docs/trainctl.md
// documents all of it for users.
#include <signal.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include <CLI/CLI.hpp>

#include "ctl/client.h"
#include "ctl/commands.h"
#include "ctl/exit_codes.h"
#include "ctl/format.h"

namespace {

using namespace trainerd::ctl;  // NOLINT: this file is the ctl program

// Ctrl-C while trainctl blocks on trainerd (logs -f, wait): exit at once with
// 128 + SIGINT; the daemon sees the connection close and the job goes on.
void OnInterrupt(int) { ::_exit(kExitInterrupted); }

std::string ExitStatusFooter() {
  auto line = [](int code, const char* what) {
    std::string n = std::to_string(code);
    n.resize(5, ' ');
    return "  " + n + what + "\n";
  };
  return "Socket: --socket PATH, else $TRAINERD_SOCKET, else the user daemon's socket\n"
         "($XDG_RUNTIME_DIR/trainerd/trainerd.sock) if it exists, else /run/trainerd/trainerd.sock.\n"
         "\n"
         "Exit status:\n" +
         line(kExitOk, "ok (wait, submit --wait/--follow: the job succeeded)") +
         line(kExitJobFailed, "the job failed, was cancelled or interrupted (wait, submit --wait/--follow)") +
         line(kExitUsage, "usage error (bad option or argument, unreadable FILE)") +
         line(kExitUnreachable, "trainerd unreachable: not running, connection lost, or a protocol error") +
         line(kExitPermissionDenied, "permission denied (not the job's owner, or the socket)") +
         line(kExitNotFound, "no such job") +
         line(kExitRejected, "rejected by trainerd (e.g. an invalid spec), or validate found errors") +
         line(kExitInternal, "internal error in trainerd") +
         line(kExitInterrupted, "interrupted (Ctrl-C)") +
         "\n"
         "Job spec files: docs/job-spec.md. This tool: docs/trainctl.md.";
}

// The command line's mistake on stderr, exit status kExitUsage (CLI11's own
// codes are not trainctl's); --help prints help and exits 0.
int ParseFailure(CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help
  std::string help = "trainctl";
  for (const CLI::App* sub : app.get_subcommands()) help += " " + sub->get_name();
  std::fprintf(stderr, "trainctl: error: %s\nRun `%s --help` for usage.\n", e.what(), help.c_str());
  return kExitUsage;
}

// Accepts a whole number in [min, max] (int64); CLI11's own range checks print
// their bounds as doubles.
CLI::Validator WholeNumber(int64_t min, int64_t max, const std::string& what) {
  return CLI::Validator(
      [min, max, what](std::string& text) -> std::string {
        int64_t value = 0;
        const char* end = text.data() + text.size();
        auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ec != std::errc() || ptr != end || value < min || value > max) {
          return "'" + text + "' is not " + what;
        }
        return "";
      },
      "", "WholeNumber");
}

bool ColourWanted(bool terminal) {
  if (!terminal) return false;
  const char* no_colour = std::getenv("NO_COLOR");
  if (no_colour != nullptr && no_colour[0] != '\0') return false;
  const char* term = std::getenv("TERM");
  return term != nullptr && std::strcmp(term, "dumb") != 0;
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int Main(int argc, char** argv) {
  CLI::App app{"trainctl: queue fine-tuning jobs on trainerd and watch them.", "trainctl"};
  app.footer(ExitStatusFooter());
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the command: `trainctl list --socket S`
  app.set_help_flag("-h,--help", "print this help and exit");

  std::string socket_flag;
  app.add_option("--socket", socket_flag, "trainerd's unix socket (default: $TRAINERD_SOCKET, else as below)")
      ->option_text("PATH");

  const CLI::Validator kJobId =
      WholeNumber(1, std::numeric_limits<int64_t>::max(), "a job id (a whole number from 1)");
  auto job_id_option = [&kJobId](CLI::App* sub, int64_t* id) {
    sub->add_option("JOB", *id, "the job's id (as submit printed it)")->required()->check(kJobId);
  };

  SubmitOptions submit;
  CLI::App* submit_cmd = app.add_subcommand("submit", "queue the job in a spec file; print its id");
  submit_cmd->add_option("FILE", submit.file,
                         "the job spec (YAML); relative paths in it are relative to its folder")
      ->required();
  submit_cmd->add_option("--name", submit.name, "the job's name (default: the file's name without .yaml)")
      ->option_text("NAME");
  submit_cmd->add_option("--priority", submit.priority, "higher runs first; FIFO within a priority (default 0)")
      ->option_text("P")
      ->check(WholeNumber(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                          "a priority (a whole number)"));
  submit_cmd->add_flag("--wait", submit.wait, "then wait until the job ends; exit status from its outcome");
  submit_cmd->add_flag("--follow,-f", submit.follow,
                       "then print its log as it grows until the job ends (as logs -f); exit as --wait");
  submit_cmd->add_flag("--parsable", submit.parsable, "print only the job id (and, with --follow, the log)");

  ListOptions list;
  CLI::App* list_cmd = app.add_subcommand("list", "list queued, running and interrupted jobs");
  list_cmd->alias("ls");
  list_cmd->add_flag("--all,-a", list.all, "include ended jobs (succeeded, failed, cancelled)");
  list_cmd->add_option("--state", list.states, "only jobs in state S (repeatable, or S1,S2)")
      ->option_text("S")
      ->delimiter(',')
      ->check(CLI::IsMember(JobStateNames()));
  list_cmd->add_flag("--json", list.json, "print a JSON array (fields in docs/trainctl.md)");

  StatusOptions status;
  CLI::App* status_cmd = app.add_subcommand("status", "show one job: state, progress, figures, outputs");
  job_id_option(status_cmd, &status.job_id);
  status_cmd->add_flag("--json", status.json, "print a JSON object (fields in docs/trainctl.md)");

  CancelOptions cancel;
  CLI::App* cancel_cmd = app.add_subcommand("cancel", "cancel jobs (a running job checkpoints and stops)");
  cancel_cmd->add_option("JOB", cancel.job_ids, "ids of the jobs to cancel")
      ->required()
      ->check(kJobId);

  LogsOptions logs;
  CLI::App* logs_cmd = app.add_subcommand("logs", "print a job's log");
  job_id_option(logs_cmd, &logs.job_id);
  logs_cmd->add_flag("--follow,-f", logs.follow, "keep printing new lines until the job ends");
  logs_cmd->add_option("--tail,-n", logs.tail, "only the last N lines (default: all)")
      ->option_text("N")
      ->check(WholeNumber(0, std::numeric_limits<int32_t>::max(), "a line count (a whole number from 0)"));

  WaitOptions wait;
  CLI::App* wait_cmd = app.add_subcommand("wait", "block until a job ends; exit 0 if it succeeded, 1 if not");
  job_id_option(wait_cmd, &wait.job_id);
  wait_cmd->add_flag("--quiet,-q", wait.quiet, "print nothing when the job succeeds");

  ValidateOptions validate;
  CLI::App* validate_cmd =
      app.add_subcommand("validate", "check a job spec as trainerd would on submit (no daemon needed)");
  validate_cmd->add_option("FILE", validate.file, "the job spec (YAML)")->required();

  for (CLI::App* sub : app.get_subcommands({})) sub->set_help_flag("-h,--help", "print this help and exit");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ParseFailure(app, e);
  }

  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);

  CommandContext context;
  context.socket =
      trainerd::client::ResolveSocketPath(socket_flag, trainerd::EnvironmentView::Process(), ::getuid());
  context.view.now_unix_ms = NowUnixMs();
  context.view.terminal = ::isatty(STDOUT_FILENO) == 1;
  context.view.colour = ColourWanted(context.view.terminal);

  if (submit_cmd->parsed()) return RunSubmit(context, submit);
  if (list_cmd->parsed()) return RunList(context, list);
  if (status_cmd->parsed()) return RunStatus(context, status);
  if (cancel_cmd->parsed()) return RunCancel(context, cancel);
  if (logs_cmd->parsed()) return RunLogs(context, logs);
  if (wait_cmd->parsed()) return RunWait(context, wait);
  if (validate_cmd->parsed()) return RunValidate(context, validate);
  return ReportError(kExitUsage, "no command given; run `trainctl --help`");
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
