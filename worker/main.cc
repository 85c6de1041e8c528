// trainerd-worker: runs one job in the foreground.
//
//   trainerd-worker run JOB.yaml [--resume]
//
// Exit status: 0 the job succeeded; 1 it failed (one line on stderr says
// why); 2 usage error; 75 stopped by SIGTERM/SIGINT after writing a checkpoint
// (resume with --resume).
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "engine/engine.h"
#include "worker/console_reporter.h"

namespace {

constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitStopped = 75;  // EX_TEMPFAIL: try again (resume) later

std::atomic<bool> g_stop{false};

void OnStopSignal(int) { g_stop.store(true); }

const char kUsage[] =
    "usage: trainerd-worker run JOB.yaml [--resume]\n"
    "\n"
    "  run JOB.yaml   run a fine-tuning or eval job in the foreground\n"
    "    --resume     continue from the newest checkpoint in output.dir/checkpoints\n"
    "\n"
    "SIGTERM or Ctrl-C finishes the current step, writes a checkpoint and exits with 75.\n"
    "Job files are documented in docs/job-spec.md.\n";

int Run(const std::string& spec_path, bool resume) {
  auto spec = trainerd::ParseJobSpecFile(spec_path);
  if (!spec.ok()) {
    std::fprintf(stderr, "error: %s\n", spec.status().message().c_str());
    return kExitFailed;
  }
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  trainerd::worker::ConsoleReporter reporter(spec->output.dir);
  trainerd::engine::RunOptions options;
  options.resume = resume;
  options.stop = &g_stop;
  auto result = trainerd::engine::RunJob(*spec, options, reporter);
  if (!result.ok()) {
    std::fprintf(stderr, "error: %s\n", result.status().message().c_str());
    return kExitFailed;
  }
  if (result->stopped) {
    std::fprintf(stderr, "stopped after step %lld; checkpoint written, resume with --resume\n",
                 static_cast<long long>(result->steps));
    return kExitStopped;
  }
  if (spec->task == "eval") {
    std::printf("eval_loss %.6f over %lld tokens; wrote %s\n", result->eval_loss,
                static_cast<long long>(result->eval_tokens), result->output_path.c_str());
  } else {
    std::printf("done: %lld steps, last step loss %.4f; wrote %s\n", static_cast<long long>(result->steps),
                result->final_loss, result->output_path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? kExitUsage : 0;
  }
  if (args[0] == "run") {
    std::string spec;
    bool resume = false;
    for (size_t i = 1; i < args.size(); ++i) {
      if (args[i] == "--resume") {
        resume = true;
      } else if (args[i] == "--help" || args[i] == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (!args[i].empty() && args[i][0] == '-') {
        std::fprintf(stderr, "error: unknown option '%s'\n\n%s", args[i].c_str(), kUsage);
        return kExitUsage;
      } else if (spec.empty()) {
        spec = args[i];
      } else {
        std::fprintf(stderr, "error: run takes one job file, got '%s' too\n\n%s", args[i].c_str(), kUsage);
        return kExitUsage;
      }
    }
    if (spec.empty()) {
      std::fprintf(stderr, "error: run needs a job file\n\n%s", kUsage);
      return kExitUsage;
    }
    return Run(spec, resume);
  }
  std::fprintf(stderr, "error: unknown command '%s'\n\n%s", args[0].c_str(), kUsage);
  return kExitUsage;
}
