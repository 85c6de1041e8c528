// trainerd-worker: runs one job in the foreground.
//
//   trainerd-worker run JOB.yaml [--resume]
//   trainerd-worker tokenize MODEL_DIR|tokenizer.json   (JSONL text in, JSONL ids out)
//   trainerd-worker preview JOB.yaml [-n N]              (the data as it will be trained)
//
// Exit status: 0 the job succeeded; 1 it failed (one line on stderr says
// why); 2 usage error; 75 stopped by SIGTERM/SIGINT after writing a checkpoint
// (resume with --resume).
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/job_spec.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "worker/console_reporter.h"
#include "worker/preview.h"

namespace {

constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitStopped = 75;  // EX_TEMPFAIL: try again (resume) later

std::atomic<bool> g_stop{false};

void OnStopSignal(int) { g_stop.store(true); }

const char kUsage[] =
    "usage: trainerd-worker run JOB.yaml [--resume]\n"
    "       trainerd-worker tokenize MODEL_DIR|tokenizer.json\n"
    "       trainerd-worker preview JOB.yaml [-n N]\n"
    "\n"
    "  run JOB.yaml   run a fine-tuning or eval job in the foreground\n"
    "    --resume     continue from the newest checkpoint in output.dir/checkpoints\n"
    "  tokenize PATH  read JSONL {\"text\": ...} lines on stdin, write {\"ids\": [...]} lines\n"
    "                 on stdout, special tokens added as the tokenizer's post-processor says\n"
    "  preview JOB.yaml  show the first N (default 3) training examples as they will be\n"
    "                 trained (masked tokens dim, or inside [[ ]] off a terminal) and the\n"
    "                 data's statistics\n"
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

// Streams JSONL texts from stdin to JSONL ids on stdout; the first bad line
// (`<stdin>:LINE: ...`) ends it with exit status 1.
int Tokenize(const std::string& tokenizer_path) {
  auto tokenizer = trainerd::engine::tokenizer::Tokenizer::FromFile(tokenizer_path);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "error: %s\n", tokenizer.status().message().c_str());
    return kExitFailed;
  }
  std::ios::sync_with_stdio(false);
  std::string line, out;
  size_t line_number = 0;
  auto fail = [&line_number](const std::string& message) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: <stdin>:%zu: %s\n", line_number, message.c_str());
    return kExitFailed;
  };
  while (std::getline(std::cin, line)) {
    ++line_number;
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return fail(std::string("malformed JSON: ") + e.what());
    }
    if (!record.is_object()) return fail("expected a JSON object {\"text\": ...}");
    auto text = record.find("text");
    if (text == record.end()) return fail("missing \"text\"");
    if (!text->is_string()) return fail("\"text\" must be a string, got " + std::string(text->type_name()));
    auto ids = (*tokenizer)->Encode(text->get_ref<const std::string&>());
    if (!ids.ok()) return fail(ids.status().message());
    out.assign("{\"ids\": [");
    for (size_t i = 0; i < ids->size(); ++i) {
      if (i > 0) out += ", ";
      out += std::to_string((*ids)[i]);
    }
    out += "]}\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  if (std::cin.bad()) return fail("read error");
  if (std::fflush(stdout) != 0) {
    std::fprintf(stderr, "error: writing to stdout failed\n");
    return kExitFailed;
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
  if (args[0] == "preview") {
    std::string spec_path;
    int64_t n = 3;
    for (size_t i = 1; i < args.size(); ++i) {
      if ((args[i] == "-n" || args[i] == "--examples") && i + 1 < args.size()) {
        char* end = nullptr;
        n = std::strtoll(args[++i].c_str(), &end, 10);
        if (*end != '\0' || n < 0) {
          std::fprintf(stderr, "error: -n wants a count of examples, got '%s'\n\n%s", args[i].c_str(), kUsage);
          return kExitUsage;
        }
      } else if (args[i] == "--help" || args[i] == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (!args[i].empty() && args[i][0] != '-' && spec_path.empty()) {
        spec_path = args[i];
      } else {
        std::fprintf(stderr, "error: unexpected argument '%s'\n\n%s", args[i].c_str(), kUsage);
        return kExitUsage;
      }
    }
    if (spec_path.empty()) {
      std::fprintf(stderr, "error: preview needs a job file\n\n%s", kUsage);
      return kExitUsage;
    }
    auto spec = trainerd::ParseJobSpecFile(spec_path);
    if (!spec.ok()) {
      std::fprintf(stderr, "error: %s\n", spec.status().message().c_str());
      return kExitFailed;
    }
    trainerd::worker::PreviewStyle style;
    style.color = isatty(STDOUT_FILENO) && std::getenv("NO_COLOR") == nullptr;
    trainerd::Status s = trainerd::worker::RunPreview(*spec, n, style, std::cout);
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.message().c_str());
      return kExitFailed;
    }
    return 0;
  }
  if (args[0] == "tokenize") {
    if (args.size() == 2 && (args[1] == "--help" || args[1] == "-h")) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (args.size() != 2 || (!args[1].empty() && args[1][0] == '-')) {
      std::fprintf(stderr, "error: tokenize takes one MODEL_DIR or tokenizer.json\n\n%s", kUsage);
      return kExitUsage;
    }
    return Tokenize(args[1]);
  }
  std::fprintf(stderr, "error: unknown command '%s'\n\n%s", args[0].c_str(), kUsage);
  return kExitUsage;
}
