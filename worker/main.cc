// trainerd-worker: runs one job in the foreground.
//
//   trainerd-worker run JOB.yaml [--resume] [--events-fd N] [--base-dir DIR] [--source NAME]
//                       [--output-dir DIR] [--checkpoint-every N] [--device D]
//   trainerd-worker devices                         (the GPUs it can use, one per line, or "cpu")
//   trainerd-worker tokenize MODEL_DIR|tokenizer.json [--threads N]  (JSONL text in, JSONL ids out)
//   trainerd-worker preview JOB.yaml [-n N]         (the data as it will be trained)
//
// Exit status: 0 the job succeeded; 1 it failed (one line on stderr says
// why); 2 usage error; 75 stopped by SIGTERM/SIGINT after writing a checkpoint
// (resume with --resume).
//
// With --events-fd N (trainerd spawns it so) the run also writes its events as
// trainerd.proto.WorkerEvent frames to the inherited fd N, ending with one
// Finished (worker/event_reporter.h); the console output and exit status are
// the same. If the reader goes away the job goes on without events. The other
// run options are how trainerd hands over a submitted job (see kUsage).
//
// A run holds an exclusive flock(2) on the output.dir folder itself until it
// exits, waiting for it if another worker holds it: a trainerd killed with
// SIGKILL leaves its worker checkpointing (it gets SIGTERM when its parent
// dies), and the next trainerd's worker for that job must resume only after.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error_lines.h"
#include "common/job_spec.h"
#include "engine/engine.h"
#include "engine/parallel_map.h"
#include "engine/tokenizer/tokenizer.h"
#include "worker/console_reporter.h"
#include "worker/event_reporter.h"
#include "worker/preview.h"

namespace {

constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitStopped = 75;  // EX_TEMPFAIL: try again (resume) later

std::atomic<bool> g_stop{false};

void OnStopSignal(int) { g_stop.store(true); }

const char kUsage[] =
    "usage: trainerd-worker run JOB.yaml [--resume] [--events-fd N] [--base-dir DIR] [--source NAME]\n"
    "                           [--output-dir DIR] [--checkpoint-every N] [--device D]\n"
    "                           [--profile TRACE.json [--profile-steps FIRST-LAST]]\n"
    "       trainerd-worker devices\n"
    "       trainerd-worker tokenize MODEL_DIR|tokenizer.json [--threads N]\n"
    "       trainerd-worker preview JOB.yaml [-n N]\n"
    "\n"
    "  run JOB.yaml   run a fine-tuning or eval job in the foreground\n"
    "    --resume     continue from the newest checkpoint in output.dir/checkpoints\n"
    "    --events-fd N  also write the run's events (trainerd.proto WorkerEvent frames)\n"
    "                 to the open, writable file descriptor N (3 or above)\n"
    "    --base-dir DIR  resolve the spec's relative paths against DIR, not the file's folder\n"
    "    --source NAME   name the spec NAME in messages (default: JOB.yaml as given)\n"
    "    --output-dir DIR  write outputs to DIR when the spec sets no output.dir\n"
    "    --checkpoint-every N  checkpoint every N steps when the spec does not say\n"
    "    --device D   run on D (cpu, cuda, cuda:N) unless the spec asks for cpu\n"
    "    --profile TRACE.json  write a Chrome trace (ui.perfetto.dev) of training steps\n"
    "                 FIRST-LAST of this run (--profile-steps, default 3-4): host operators,\n"
    "                 GPU kernels and copies; bench/speed/trace_summary.py totals it\n"
    "  devices        print the GPUs this worker can use (cuda:0, ...), or cpu when none\n"
    "  tokenize PATH  read JSONL {\"text\": ...} lines on stdin, write {\"ids\": [...]} lines\n"
    "                 on stdout, special tokens added as the tokenizer's post-processor says\n"
    "    --threads N  encode on N threads (default: all cores); the output is the same for any N\n"
    "  preview JOB.yaml  show the first N (default 3) training examples as they will be\n"
    "                 trained (masked tokens dim, or inside [[ ]] off a terminal) and the\n"
    "                 data's statistics\n"
    "\n"
    "SIGTERM or Ctrl-C finishes the current step, writes a checkpoint and exits with 75.\n"
    "Job files are documented in docs/job-spec.md.\n";

// A command-line mistake: one "error:" line and the usage on stderr, exit 2.
int UsageError(const std::string& message) {
  std::fprintf(stderr, "error: %s\n\n%s", message.c_str(), kUsage);
  return kExitUsage;
}

// Passes every event to each of its reporters in turn.
class FanOutReporter : public trainerd::engine::Reporter {
 public:
  explicit FanOutReporter(std::vector<trainerd::engine::Reporter*> reporters) : reporters_(std::move(reporters)) {}
  void OnStart(const trainerd::engine::RunInfo& info) override {
    for (auto* r : reporters_) r->OnStart(info);
  }
  void OnProgress(const trainerd::engine::ProgressEvent& e) override {
    for (auto* r : reporters_) r->OnProgress(e);
  }
  void OnEval(const trainerd::engine::EvalEvent& e) override {
    for (auto* r : reporters_) r->OnEval(e);
  }
  void OnCheckpoint(const trainerd::engine::CheckpointEvent& e) override {
    for (auto* r : reporters_) r->OnCheckpoint(e);
  }
  void OnMessage(const std::string& text) override {
    for (auto* r : reporters_) r->OnMessage(text);
  }

 private:
  std::vector<trainerd::engine::Reporter*> reporters_;
};

// The fd of `--events-fd VALUE`, or -1 with the reason in *error: VALUE must
// be a number of an fd open for writing, and not stdin, stdout or stderr.
int ParseEventsFd(const std::string& value, std::string* error) {
  int fd = -1;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), fd);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || fd < 0) {
    *error = "--events-fd wants a file descriptor number, got '" + value + "'";
    return -1;
  }
  if (fd <= STDERR_FILENO) {
    *error = "--events-fd " + value + " is stdin, stdout or stderr; pass an fd of 3 or above";
    return -1;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags == -1) {
    *error = "--events-fd " + value + ": fd " + value + " is not open";
    return -1;
  }
  if ((flags & O_ACCMODE) == O_RDONLY) {
    *error = "--events-fd " + value + ": fd " + value + " is not open for writing";
    return -1;
  }
  return fd;
}

// How `run` was asked to run the job.
struct RunArgs {
  std::string spec_path;
  bool resume = false;
  int events_fd = -1;       // -1: no events
  std::string base_dir;     // empty: the spec file's folder
  std::string source;       // empty: spec_path
  std::string output_dir;   // empty: the spec must set output.dir
  std::optional<int64_t> checkpoint_every;
  std::string device;       // empty: the spec's
  trainerd::engine::ProfileRequest profile;
};

// The spec as `args` say to read it.
trainerd::StatusOr<trainerd::JobSpec> LoadSpec(const RunArgs& args) {
  trainerd::JobSpecDefaults defaults;
  defaults.output_dir_required = args.output_dir.empty();
  if (args.checkpoint_every) defaults.checkpoint_every = *args.checkpoint_every;
  trainerd::StatusOr<trainerd::JobSpec> spec = trainerd::Status::Ok();
  if (args.base_dir.empty()) {
    spec = trainerd::ParseJobSpecFile(args.spec_path, defaults);
  } else {
    std::ifstream in(args.spec_path, std::ios::binary);
    if (!in) return trainerd::Status::Error("cannot open job spec " + args.spec_path + ": " + std::strerror(errno));
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    spec = trainerd::ParseJobSpecText(text, args.source.empty() ? args.spec_path : args.source, args.base_dir,
                                      defaults);
  }
  if (!spec.ok()) return spec;
  if (spec->output.dir.empty()) spec->output.dir = args.output_dir;
  if (!args.device.empty() && spec->device != "cpu") spec->device = args.device;
  return spec;
}

// mkdir -p `path` (absolute).
trainerd::Status MakeDirs(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    const std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return trainerd::Status::Error("creating " + prefix + ": " + std::strerror(errno));
    }
  }
  return trainerd::Status::Ok();
}

// Takes the output folder's lock (see the file comment), waiting while another
// worker holds it. Returns the folder's fd, kept open (and so locked) until exit.
trainerd::StatusOr<int> LockOutputDir(const std::string& output_dir) {
  TRAINERD_RETURN_IF_ERROR(MakeDirs(output_dir));
  const int fd = ::open(output_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return trainerd::Status::Error("opening " + output_dir + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
  std::fprintf(stderr, "waiting for the other worker writing %s to exit\n", output_dir.c_str());
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno == EINTR && !g_stop.load()) continue;
    const std::string why = g_stop.load() ? "stopped while waiting" : std::strerror(errno);
    ::close(fd);
    return trainerd::Status::Error("locking " + output_dir + ": " + why);
  }
  return fd;
}

// Runs the job; with events_fd >= 0 also reports it there as WorkerEvent frames.
int Run(const RunArgs& args) {
  std::optional<trainerd::worker::EventReporter> events;
  if (args.events_fd >= 0) events.emplace(args.events_fd);
  auto fail = [&events](const std::string& message) {
    trainerd::PrintErrorLines("error: ", message);
    if (events) events->Finish(/*stopped=*/false, /*output_path=*/"", /*eval_loss=*/0, message);
    return kExitFailed;
  };

  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // Output to a reader that went away (trainerd killed: its pipe has no reader
  // left) must not kill the run before it can checkpoint: writes fail instead.
  std::signal(SIGPIPE, SIG_IGN);
  auto spec = LoadSpec(args);
  if (!spec.ok()) return fail(spec.status().message());
  auto lock = LockOutputDir(spec->output.dir);
  if (!lock.ok() && g_stop.load()) {  // stopped before it began: nothing to checkpoint
    if (events) events->Finish(/*stopped=*/true, /*output_path=*/"", /*eval_loss=*/0, /*error=*/"");
    std::fprintf(stderr, "stopped while waiting for %s; resume with --resume\n", spec->output.dir.c_str());
    return kExitStopped;
  }
  if (!lock.ok()) return fail(lock.status().message());

  trainerd::worker::ConsoleReporter console(spec->output.dir);
  std::vector<trainerd::engine::Reporter*> reporters{&console};
  if (events) reporters.push_back(&*events);
  FanOutReporter reporter(std::move(reporters));
  trainerd::engine::RunOptions options;
  options.resume = args.resume;
  options.stop = &g_stop;
  options.profile = args.profile;
  auto result = trainerd::engine::RunJob(*spec, options, reporter);
  if (!result.ok()) return fail(result.status().message());
  if (events) events->Finish(result->stopped, result->output_path, result->eval_loss, /*error=*/"");
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

// One input line's result: its output line ({"ids": [...]}\n), or why it failed.
struct EncodedLine {
  bool ok = false;
  std::string text;
};

EncodedLine EncodeLine(const trainerd::engine::tokenizer::Tokenizer& tokenizer, const std::string& line) {
  EncodedLine result;
  nlohmann::json record;
  try {
    record = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    result.text = std::string("malformed JSON: ") + e.what();
    return result;
  }
  if (!record.is_object()) {
    result.text = "expected a JSON object {\"text\": ...}";
    return result;
  }
  auto text = record.find("text");
  if (text == record.end()) {
    result.text = "missing \"text\"";
    return result;
  }
  if (!text->is_string()) {
    result.text = "\"text\" must be a string, got " + std::string(text->type_name());
    return result;
  }
  auto ids = tokenizer.Encode(text->get_ref<const std::string&>());
  if (!ids.ok()) {
    result.text = ids.status().message();
    return result;
  }
  std::string& out = result.text;
  out.reserve(12 + ids->size() * 8);
  out.assign("{\"ids\": [");
  char number[16];
  for (size_t i = 0; i < ids->size(); ++i) {
    if (i > 0) out += ", ";
    auto [end, ec] = std::to_chars(number, number + sizeof(number), (*ids)[i]);
    out.append(number, end);
  }
  out += "]}\n";
  result.ok = true;
  return result;
}

// Streams JSONL texts from stdin to JSONL ids on stdout, in input order. Lines
// are read in batches (at most kBatchLines lines or about kBatchBytes bytes)
// and each batch is encoded on `threads` threads, so memory stays bounded on
// any input and the output is the same for any thread count. With more than
// one thread the next batch is read, and the previous one written, while a
// batch encodes. The first bad line (`<stdin>:LINE: ...`) ends it with exit
// status 1, every line before it written.
int Tokenize(const std::string& tokenizer_path, int threads) {
  auto tokenizer = trainerd::engine::tokenizer::Tokenizer::FromFile(tokenizer_path);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "error: %s\n", tokenizer.status().message().c_str());
    return kExitFailed;
  }
  const trainerd::engine::tokenizer::Tokenizer& tok = **tokenizer;
  constexpr size_t kBatchLines = 4096;
  constexpr size_t kBatchBytes = size_t{8} << 20;
  std::ios::sync_with_stdio(false);

  // Two line buffers: one being encoded while the other is read.
  std::vector<std::string> buffers[2];
  auto read_batch = [](std::vector<std::string>& lines) {
    lines.clear();
    size_t bytes = 0;
    std::string line;
    while (lines.size() < kBatchLines && bytes < kBatchBytes && std::getline(std::cin, line)) {
      bytes += line.size();
      lines.push_back(std::move(line));
    }
  };
  auto encode_batch = [&tok, threads](const std::vector<std::string>* lines) {
    return trainerd::engine::ParallelMap<EncodedLine>(lines->size(), threads,
                                                      [&](size_t i) { return EncodeLine(tok, (*lines)[i]); });
  };
  // One thread does everything in turn (deferred runs at get()); more overlap I/O with encoding.
  const auto policy = threads > 1 ? std::launch::async : std::launch::deferred;

  if (!isatty(STDOUT_FILENO)) std::setvbuf(stdout, nullptr, _IOFBF, size_t{1} << 20);
  size_t first_line = 1;  // the line number of the batch being encoded's first line
  int current = 0;
  read_batch(buffers[current]);
  std::future<std::vector<EncodedLine>> pending;
  if (!buffers[current].empty()) pending = std::async(policy, encode_batch, &buffers[current]);
  while (pending.valid()) {
    std::vector<std::string>& next = buffers[1 - current];
    read_batch(next);
    std::vector<EncodedLine> results = pending.get();
    if (!next.empty()) pending = std::async(policy, encode_batch, &next);  // encodes while we write
    for (size_t i = 0; i < results.size(); ++i) {
      if (!results[i].ok) {
        std::fflush(stdout);
        std::fprintf(stderr, "error: <stdin>:%zu: %s\n", first_line + i, results[i].text.c_str());
        return kExitFailed;
      }
      std::fwrite(results[i].text.data(), 1, results[i].text.size(), stdout);
    }
    first_line += results.size();
    current = 1 - current;
  }
  if (std::cin.bad()) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: <stdin>:%zu: read error\n", first_line);
    return kExitFailed;
  }
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
    RunArgs run;
    for (size_t i = 1; i < args.size(); ++i) {
      // "--name VALUE" or "--name=VALUE": true and the value in *value when args[i] is option `name`.
      std::string value;
      bool missing = false;
      auto option = [&](const char* name) {
        const std::string n(name);
        if (args[i] == n) {
          if (i + 1 < args.size()) {
            value = args[++i];
          } else {
            missing = true;
          }
          return true;
        }
        if (args[i].rfind(n + "=", 0) == 0) {
          value = args[i].substr(n.size() + 1);
          return true;
        }
        return false;
      };
      if (args[i] == "--resume") {
        run.resume = true;
      } else if (option("--events-fd")) {
        std::string error;
        run.events_fd = ParseEventsFd(value, &error);
        if (run.events_fd < 0) return UsageError(error);
      } else if (option("--base-dir")) {
        if (missing || value.empty() || value[0] != '/') {
          return UsageError("--base-dir wants an absolute folder, got '" + value + "'");
        }
        run.base_dir = value;
      } else if (option("--output-dir")) {
        if (missing || value.empty() || value[0] != '/') {
          return UsageError("--output-dir wants an absolute folder, got '" + value + "'");
        }
        run.output_dir = value;
      } else if (option("--source")) {
        if (missing) return UsageError("--source wants a name");
        run.source = value;
      } else if (option("--checkpoint-every")) {
        int64_t n = -1;
        auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
        if (missing || value.empty() || ec != std::errc() || end != value.data() + value.size() || n < 0) {
          return UsageError("--checkpoint-every wants a step count (0 or more), got '" + value + "'");
        }
        run.checkpoint_every = n;
      } else if (option("--device")) {
        if (missing || !(value == "cpu" || value == "cuda" || value.rfind("cuda:", 0) == 0)) {
          return UsageError("--device wants cpu, cuda or cuda:N, got '" + value + "'");
        }
        run.device = value;
      } else if (option("--profile")) {
        if (missing || value.empty()) return UsageError("--profile wants a trace file to write");
        run.profile.path = value;
      } else if (option("--profile-steps")) {
        int64_t first = 0, last = 0;
        const size_t dash = value.find('-');
        const std::string a = value.substr(0, dash), b = dash == std::string::npos ? a : value.substr(dash + 1);
        auto [end_a, ec_a] = std::from_chars(a.data(), a.data() + a.size(), first);
        auto [end_b, ec_b] = std::from_chars(b.data(), b.data() + b.size(), last);
        if (missing || a.empty() || b.empty() || ec_a != std::errc() || ec_b != std::errc() ||
            end_a != a.data() + a.size() || end_b != b.data() + b.size() || first < 1 || last < first) {
          return UsageError("--profile-steps wants FIRST-LAST (or one step), counted from 1, got '" + value + "'");
        }
        run.profile.first = first;
        run.profile.last = last;
      } else if (args[i] == "--help" || args[i] == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (!args[i].empty() && args[i][0] == '-') {
        return UsageError("unknown option '" + args[i] + "'");
      } else if (run.spec_path.empty()) {
        run.spec_path = args[i];
      } else {
        return UsageError("run takes one job file, got '" + args[i] + "' too");
      }
    }
    if (run.spec_path.empty()) {
      return UsageError("run needs a job file");
    }
    return Run(run);
  }
  if (args[0] == "devices") {
    if (args.size() > 1) return UsageError("devices takes no arguments");
    const std::vector<std::string> devices = trainerd::engine::CudaDevices();
    if (devices.empty()) std::puts("cpu");
    for (const std::string& d : devices) std::puts(d.c_str());
    return 0;
  }
  if (args[0] == "preview") {
    std::string spec_path;
    int64_t n = 3;
    for (size_t i = 1; i < args.size(); ++i) {
      if ((args[i] == "-n" || args[i] == "--examples") && i + 1 < args.size()) {
        char* end = nullptr;
        n = std::strtoll(args[++i].c_str(), &end, 10);
        if (*end != '\0' || n < 0) {
          return UsageError("-n wants a count of examples, got '" + args[i] + "'");
        }
      } else if (args[i] == "--help" || args[i] == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (!args[i].empty() && args[i][0] != '-' && spec_path.empty()) {
        spec_path = args[i];
      } else {
        return UsageError("unexpected argument '" + args[i] + "'");
      }
    }
    if (spec_path.empty()) {
      return UsageError("preview needs a job file");
    }
    auto spec = trainerd::ParseJobSpecFile(spec_path);
    if (!spec.ok()) {
      trainerd::PrintErrorLines("error: ", spec.status().message());
      return kExitFailed;
    }
    trainerd::worker::PreviewStyle style;
    style.color = isatty(STDOUT_FILENO) && std::getenv("NO_COLOR") == nullptr;
    trainerd::Status s = trainerd::worker::RunPreview(*spec, n, style, std::cout);
    if (!s.ok()) {
      trainerd::PrintErrorLines("error: ", s.message());
      return kExitFailed;
    }
    return 0;
  }
  if (args[0] == "tokenize") {
    std::string path;
    int threads = trainerd::engine::AllCores();
    for (size_t i = 1; i < args.size(); ++i) {
      if (args[i] == "--threads") {
        const std::string value = i + 1 < args.size() ? args[++i] : "";
        char* end = nullptr;
        const long n = std::strtol(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || n < 1 || n > 4096) {
          return UsageError("--threads wants a thread count of at least 1, got '" + value + "'");
        }
        threads = static_cast<int>(n);
      } else if (args[i] == "--help" || args[i] == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (!args[i].empty() && args[i][0] == '-') {
        return UsageError("unknown option '" + args[i] + "'");
      } else if (path.empty()) {
        path = args[i];
      } else {
        return UsageError("tokenize takes one MODEL_DIR or tokenizer.json, got '" + args[i] + "' too");
      }
    }
    if (path.empty()) {
      return UsageError("tokenize takes one MODEL_DIR or tokenizer.json");
    }
    return Tokenize(path, threads);
  }
  return UsageError("unknown command '" + args[0] + "'");
}
