// daemon_bench: trainerd's start-up time and the latency of `status` and
// `list` with a large queue and a job running (bench/README.md).
//
//   daemon_bench [--jobs 10000] [--queued 50] [--starts 5] [--json FILE] [...]  (--help)
//
// 1. Fills a fresh state folder's queue.db with --jobs jobs through JobStore
//    (bench/daemon/queue_fill.h), timed on its own.
// 2. Starts the real trainerd (--socket, --state-dir, --gpus cpu) --starts
//    times, SIGTERM between: from spawn until the socket accepts, and until
//    a first `status` is answered. Each start also starts the head queued job
//    on the CPU, as a daemon with a queue does; before each SIGTERM the
//    benchmark waits until that job trains, so every stop checkpoints a worker.
// 3. Submits one long job of the tiny fixture model (priority above the
//    queue), cancels the queued job that was running, and waits until the new
//    job reports steps: the daemon now serves a worker's events.
// 4. Times status JOB (random ids), list and list --all through the client
//    library (ctl/client.h), each call on a fresh connection as trainctl
//    makes it; then the same through the trainctl program, spawn to exit.
// 5. Prints Markdown tables, writes the figures as JSON, stops trainerd
//    (SIGTERM) and removes the temporary folder (--keep leaves it).
//
// Exit status: 0 measured (whether or not the goals were met), 1 a step failed,
// 2 (or CLI11's code) a usage error.
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/daemon/child.h"
#include "bench/daemon/latency_summary.h"
#include "bench/daemon/queue_fill.h"
#include "common/status.h"
#include "ctl/client.h"
#include "daemon/job_store.h"
#include "proto/trainerd.pb.h"

namespace trainerd::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// The goals of the issue this benchmark answers.
constexpr double kLatencyGoalMs = 10;
constexpr double kStartGoalMs = 1000;
// Calls made before each timed series and not counted.
constexpr int kWarmUpCalls = 20;
// A reply that takes longer means trainerd hangs: the benchmark stops.
constexpr int kReplyTimeoutSeconds = 60;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string Fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, value);
  return buf;
}

struct Options {
  std::string trainerd = std::string(TRAINERD_BINARY_DIR) + "/bin/trainerd";
  std::string trainctl = std::string(TRAINERD_BINARY_DIR) + "/bin/trainctl";
  std::string worker = std::string(TRAINERD_BINARY_DIR) + "/bin/trainerd-worker";
  std::string fixtures = TRAINERD_FIXTURES;
  std::string work_dir;  // empty: a new temporary folder
  std::string json_path = "daemon-bench.json";
  int64_t jobs = 10000;
  int64_t queued = 50;
  int starts = 5;
  int status_calls = 2000;
  int list_calls = 2000;
  int list_all_calls = 200;
  int ctl_status_calls = 200;
  int ctl_list_calls = 50;
  int ctl_list_all_calls = 20;
  int64_t log_every = 10;
  int worker_threads = 0;  // 0: the worker's own default (LibTorch: one thread per core)
  double baseline_seconds = 5;
  bool keep = false;
  uint64_t seed = 1;
};

// The last lines of a log file, for error messages.
std::string Tail(const std::string& path, size_t lines = 15) {
  const std::string text = ReadText(path);
  size_t at = text.size();
  for (size_t n = 0; n <= lines && at > 0; ++n) at = text.rfind('\n', at - 1);
  return at == std::string::npos || at == 0 ? text : text.substr(at + 1);
}

// One request on a fresh connection, as trainctl makes it: connect, send,
// read the one reply, close.
struct TimedReply {
  double total_ms = 0;    // connect + request + reply + close
  double connect_ms = 0;  // of which connecting
  proto::Reply reply;
};

StatusOr<TimedReply> CallOnce(const std::string& socket, const proto::Request& request) {
  TimedReply out;
  const auto start = Clock::now();
  client::Connection connection;
  TRAINERD_RETURN_IF_ERROR(connection.Connect(socket));
  out.connect_ms = MsSince(start);
  timeval timeout{kReplyTimeoutSeconds, 0};
  ::setsockopt(connection.fd(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  TRAINERD_ASSIGN_OR_RETURN(out.reply, connection.Call(request));
  connection.Close();
  out.total_ms = MsSince(start);
  if (out.reply.error().code() != proto::ERROR_CODE_NONE) {
    return Status::Error(std::string(client::RequestKindName(request.kind_case())) +
                         ": trainerd answered with an error: " + out.reply.error().message());
  }
  return out;
}

proto::Request StatusRequest(int64_t id) {
  proto::Request r;
  r.mutable_status()->set_job_id(id);
  return r;
}

proto::Request ListRequest(bool all, const std::vector<proto::JobState>& states = {}) {
  proto::Request r;
  r.mutable_list()->set_all(all);
  for (proto::JobState s : states) r.mutable_list()->add_states(s);
  return r;
}

// trainerd on the benchmark's socket and state folder. The destructor stops
// one still running (SIGTERM, then SIGKILL after two minutes).
class Daemon {
 public:
  Daemon(const Options& options, std::string dir) : options_(options), dir_(std::move(dir)) {}
  ~Daemon() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    if (!WaitForExit(pid_, std::chrono::minutes(2))) {
      ::kill(pid_, SIGKILL);
      (void)WaitForExit(pid_, std::chrono::seconds(10));
    }
  }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  std::string socket() const { return dir_ + "/sock"; }
  std::string state_dir() const { return dir_ + "/state"; }
  std::string log_path() const { return dir_ + "/trainerd-" + std::to_string(starts_) + ".log"; }
  pid_t pid() const { return pid_; }

  struct StartTimes {
    double accepts_ms = 0;       // spawn → the socket accepts a connection
    double first_status_ms = 0;  // spawn → the first status answered
    double ready_log_ms = -1;    // trainerd's own "ready in N ms" (config read → listening)
  };

  StatusOr<StartTimes> Start() {
    ++starts_;
    const std::string config = dir_ + "/trainerd.yaml";
    std::ofstream(config) << "# daemon_bench: a long grace, so stops always checkpoint.\nstop_grace_seconds: 120\n";
    std::vector<std::string> env = {"XDG_CACHE_HOME=" + dir_ + "/cache"};
    if (options_.worker_threads > 0) env.push_back("OMP_NUM_THREADS=" + std::to_string(options_.worker_threads));

    StartTimes times;
    const auto start = Clock::now();
    TRAINERD_ASSIGN_OR_RETURN(pid_, SpawnProgram({options_.trainerd, "--config", config, "--socket", socket(),
                                                  "--state-dir", state_dir(), "--gpus", "cpu", "--worker",
                                                  options_.worker},
                                                 env, log_path()));
    client::Connection connection;
    while (true) {
      if (connection.Connect(socket()).ok()) break;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return Status::Error("trainerd " + DescribeWaitStatus(status) + " at start; its log " + log_path() +
                             " ends:\n" + Tail(log_path()));
      }
      if (MsSince(start) > 60000) return Status::Error("trainerd did not listen within 60 s; see " + log_path());
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    times.accepts_ms = MsSince(start);
    TRAINERD_ASSIGN_OR_RETURN(proto::Reply reply, connection.Call(StatusRequest(1)));
    times.first_status_ms = MsSince(start);
    if (reply.error().code() != proto::ERROR_CODE_NONE) {
      return Status::Error("the first status call failed: " + reply.error().message());
    }
    std::smatch match;
    const std::string log = ReadText(log_path());
    if (std::regex_search(log, match, std::regex("ready in ([0-9]+) ms"))) times.ready_log_ms = std::stod(match[1]);
    return times;
  }

  // SIGTERM; the milliseconds until trainerd exited (with status 0).
  StatusOr<double> Stop() {
    const auto start = Clock::now();
    ::kill(pid_, SIGTERM);
    const std::optional<int> status = WaitForExit(pid_, std::chrono::minutes(3));
    if (!status) return Status::Error("trainerd did not stop within 3 minutes of SIGTERM; see " + log_path());
    const double ms = MsSince(start);
    pid_ = -1;
    if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
      return Status::Error("trainerd " + DescribeWaitStatus(*status) + " after SIGTERM; its log ends:\n" +
                           Tail(log_path()));
    }
    return ms;
  }

 private:
  const Options& options_;
  std::string dir_;
  pid_t pid_ = -1;
  int starts_ = 0;
};

// The running jobs' ids (list with state running).
StatusOr<std::vector<proto::Job>> RunningJobs(const std::string& socket) {
  TRAINERD_ASSIGN_OR_RETURN(TimedReply r, CallOnce(socket, ListRequest(false, {proto::JOB_STATE_RUNNING})));
  return std::vector<proto::Job>(r.reply.list().jobs().begin(), r.reply.list().jobs().end());
}

StatusOr<proto::Job> JobStatus(const std::string& socket, int64_t id) {
  TRAINERD_ASSIGN_OR_RETURN(TimedReply r, CallOnce(socket, StatusRequest(id)));
  return r.reply.status().job();
}

// Waits until `pred(running jobs)` holds.
template <class Pred>
Status WaitUntil(const std::string& socket, const std::string& what, std::chrono::seconds timeout, Pred pred) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    TRAINERD_ASSIGN_OR_RETURN(std::vector<proto::Job> running, RunningJobs(socket));
    if (pred(running)) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status::Error("timed out after " + std::to_string(timeout.count()) + " s waiting until " + what);
}

// True when a job in `now` has reported a step beyond the one it showed in
// `before` (a resumed job shows its last attempt's progress until its worker reports).
bool SomeJobAdvanced(const std::vector<proto::Job>& before, const std::vector<proto::Job>& now) {
  for (const proto::Job& job : now) {
    int64_t step = 0;
    for (const proto::Job& b : before) {
      if (b.id() == job.id()) step = b.progress().step();
    }
    if (job.progress().step() > step) return true;
  }
  return false;
}

// One timed series of requests.
struct Series {
  std::string name;
  std::string via;  // "client library" or "trainctl"
  LatencySummary total;
  LatencySummary connect;          // client library only
  double mean_reply_bytes = 0;     // client library only
  int64_t max_jobs_in_reply = 0;   // client library only
  double daemon_cpu_ms_per_call = -1;  // trainerd's CPU per call, its background rate subtracted
  double client_parse_ms = -1;     // parsing the largest reply again in this process (median of 20)
  int64_t step_before = 0, step_after = 0;  // the running job's, around the series
  double seconds = 0;
};

struct Background {
  double daemon_cpu_ms_per_s = 0;  // trainerd's CPU while only the running job reports
  double steps_per_s = 0;          // the running job's training speed
};

class Measurer {
 public:
  Measurer(const Options& options, Daemon& daemon, int64_t running_job, int64_t jobs_in_store)
      : options_(options), daemon_(daemon), running_job_(running_job), ids_(1, jobs_in_store), rng_(options.seed) {}

  StatusOr<Background> MeasureBackground() {
    TRAINERD_ASSIGN_OR_RETURN(proto::Job before, JobStatus(daemon_.socket(), running_job_));
    const double cpu0 = ProcessCpuMs(daemon_.pid());
    const auto start = Clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(options_.baseline_seconds));
    const double cpu1 = ProcessCpuMs(daemon_.pid());
    const double seconds = MsSince(start) / 1000.0;
    TRAINERD_ASSIGN_OR_RETURN(proto::Job after, JobStatus(daemon_.socket(), running_job_));
    background_.daemon_cpu_ms_per_s = (cpu1 - cpu0) / seconds;
    background_.steps_per_s = static_cast<double>(after.progress().step() - before.progress().step()) / seconds;
    return background_;
  }

  // `make` builds the i-th request.
  template <class Make>
  StatusOr<Series> ViaLibrary(const std::string& name, int calls, Make make) {
    Series s;
    s.name = name;
    s.via = "client library";
    for (int i = 0; i < kWarmUpCalls; ++i) TRAINERD_RETURN_IF_ERROR(CallOnce(daemon_.socket(), make()).status());
    TRAINERD_ASSIGN_OR_RETURN(proto::Job before, JobStatus(daemon_.socket(), running_job_));
    std::vector<double> total, connect;
    double reply_bytes = 0;
    proto::Reply largest;
    size_t largest_bytes = 0;
    const double cpu0 = ProcessCpuMs(daemon_.pid());
    const auto start = Clock::now();
    for (int i = 0; i < calls; ++i) {
      TRAINERD_ASSIGN_OR_RETURN(TimedReply r, CallOnce(daemon_.socket(), make()));
      total.push_back(r.total_ms);
      connect.push_back(r.connect_ms);
      const size_t bytes = r.reply.ByteSizeLong();
      reply_bytes += static_cast<double>(bytes);
      if (r.reply.has_list()) s.max_jobs_in_reply = std::max<int64_t>(s.max_jobs_in_reply, r.reply.list().jobs_size());
      if (r.reply.has_status()) s.max_jobs_in_reply = 1;
      if (bytes > largest_bytes) {
        largest_bytes = bytes;
        largest = std::move(r.reply);
      }
    }
    s.seconds = MsSince(start) / 1000.0;
    const double cpu1 = ProcessCpuMs(daemon_.pid());
    TRAINERD_ASSIGN_OR_RETURN(proto::Job after, JobStatus(daemon_.socket(), running_job_));
    s.step_before = before.progress().step();
    s.step_after = after.progress().step();
    s.total = Summarize(total);
    s.connect = Summarize(connect);
    s.mean_reply_bytes = calls > 0 ? reply_bytes / calls : 0;
    if (calls > 0) {
      s.daemon_cpu_ms_per_call =
          std::max(0.0, (cpu1 - cpu0) - background_.daemon_cpu_ms_per_s * s.seconds) / calls;
    }
    // The client's share: parsing the largest reply (a list --all: 10,000 Jobs).
    const std::string bytes = largest.SerializeAsString();
    std::vector<double> parse;
    for (int i = 0; i < 20; ++i) {
      proto::Reply again;
      const auto t = Clock::now();
      again.ParseFromString(bytes);
      parse.push_back(MsSince(t));
    }
    s.client_parse_ms = Summarize(parse).p50;
    return s;
  }

  // `trainctl ARGS` (from `make`), spawned and waited for; output dropped.
  template <class Make>
  StatusOr<Series> ViaTrainctl(const std::string& name, int calls, Make make) {
    Series s;
    s.name = name;
    s.via = "trainctl";
    auto run = [&]() -> StatusOr<double> {
      std::vector<std::string> argv = {options_.trainctl, "--socket", daemon_.socket()};
      for (std::string& a : make()) argv.push_back(std::move(a));
      const auto start = Clock::now();
      TRAINERD_ASSIGN_OR_RETURN(pid_t pid, SpawnProgram(argv, {}, "/dev/null"));
      const std::optional<int> status = WaitForExit(pid, std::chrono::seconds(kReplyTimeoutSeconds));
      const double ms = MsSince(start);
      if (!status) {
        ::kill(pid, SIGKILL);
        (void)WaitForExit(pid, std::chrono::seconds(10));
        return Status::Error("trainctl " + argv[3] + " did not finish within " +
                             std::to_string(kReplyTimeoutSeconds) + " s");
      }
      if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
        return Status::Error("trainctl " + argv[3] + " " + DescribeWaitStatus(*status));
      }
      return ms;
    };
    for (int i = 0; i < std::min(kWarmUpCalls, std::max(calls, 1)); ++i) TRAINERD_RETURN_IF_ERROR(run().status());
    TRAINERD_ASSIGN_OR_RETURN(proto::Job before, JobStatus(daemon_.socket(), running_job_));
    std::vector<double> total;
    const double cpu0 = ProcessCpuMs(daemon_.pid());
    const auto start = Clock::now();
    for (int i = 0; i < calls; ++i) {
      TRAINERD_ASSIGN_OR_RETURN(double ms, run());
      total.push_back(ms);
    }
    s.seconds = MsSince(start) / 1000.0;
    const double cpu1 = ProcessCpuMs(daemon_.pid());
    TRAINERD_ASSIGN_OR_RETURN(proto::Job after, JobStatus(daemon_.socket(), running_job_));
    s.step_before = before.progress().step();
    s.step_after = after.progress().step();
    s.total = Summarize(total);
    if (calls > 0) {
      s.daemon_cpu_ms_per_call =
          std::max(0.0, (cpu1 - cpu0) - background_.daemon_cpu_ms_per_s * s.seconds) / calls;
    }
    return s;
  }

  int64_t RandomId() { return ids_(rng_); }

 private:
  const Options& options_;
  Daemon& daemon_;
  int64_t running_job_;
  std::uniform_int_distribution<int64_t> ids_;
  std::mt19937_64 rng_;
  Background background_;
};

json SummaryJson(const LatencySummary& s) {
  return {{"count", s.count}, {"min_ms", s.min}, {"p50_ms", s.p50}, {"p90_ms", s.p90},
          {"p99_ms", s.p99},   {"max_ms", s.max}, {"mean_ms", s.mean}};
}

// min, median, max of a few values.
struct Spread {
  double min = 0, median = 0, max = 0;
};
Spread SpreadOf(std::vector<double> v) {
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  return s;
}

json MachineJson() {
  json m;
  utsname u{};
  if (::uname(&u) == 0) m["kernel"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
  m["cpus_online"] = ::sysconf(_SC_NPROCESSORS_ONLN);
  std::smatch match;
  const std::string cpuinfo = ReadText("/proc/cpuinfo");
  if (std::regex_search(cpuinfo, match, std::regex("model name\\s*:\\s*([^\n]*)"))) m["cpu"] = match[1].str();
  const std::string os = ReadText("/etc/os-release");
  if (std::regex_search(os, match, std::regex("PRETTY_NAME=\"?([^\"\n]*)"))) m["os"] = match[1].str();
  return m;
}

// The 1-minute load average: other work on the machine shows in every figure.
double LoadAverage() {
  double load = -1;
  std::ifstream("/proc/loadavg") >> load;
  return load;
}

class Benchmark {
 public:
  explicit Benchmark(Options options) : o_(std::move(options)) {}

  Status Run() {
    TRAINERD_RETURN_IF_ERROR(CheckPrograms());
    TRAINERD_RETURN_IF_ERROR(MakeWorkDir());
    Progress("working in " + dir_);
    results_["machine"] = MachineJson();
    results_["options"] = {{"jobs", o_.jobs},           {"queued", o_.queued},
                           {"starts", o_.starts},       {"log_every", o_.log_every},
                           {"worker_threads", o_.worker_threads},
                           {"trainerd", o_.trainerd},   {"trainctl", o_.trainctl},
                           {"worker", o_.worker}};

    TRAINERD_RETURN_IF_ERROR(Fill());
    Daemon daemon(o_, dir_);
    TRAINERD_RETURN_IF_ERROR(StartUps(daemon));
    TRAINERD_ASSIGN_OR_RETURN(int64_t running, StartRunningJob(daemon));
    TRAINERD_RETURN_IF_ERROR(Latencies(daemon, running));

    Progress("stopping trainerd (its worker checkpoints)");
    TRAINERD_ASSIGN_OR_RETURN(double stop_ms, daemon.Stop());
    results_["final_stop_ms"] = stop_ms;

    Report();
    if (!o_.json_path.empty()) {
      std::ofstream out(o_.json_path);
      out << results_.dump(2) << "\n";
      if (!out) return Status::Error("writing " + o_.json_path + " failed");
      std::printf("\nfigures written to %s\n", o_.json_path.c_str());
    }
    return Status::Ok();
  }

  // Removes the temporary folder unless --keep or the run failed.
  void CleanUp(bool succeeded) {
    if (dir_.empty()) return;
    if (o_.keep || !succeeded) {
      std::fprintf(stderr, "daemon_bench: left %s (logs: trainerd-*.log, state/)\n", dir_.c_str());
      return;
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

 private:
  static void Progress(const std::string& text) {
    std::fprintf(stderr, "daemon_bench: %s\n", text.c_str());
  }

  Status CheckPrograms() const {
    for (const std::string& p : {o_.trainerd, o_.trainctl, o_.worker}) {
      if (::access(p.c_str(), X_OK) != 0) {
        return Status::Error(p + " is not an executable program; build it (bench/daemon/run.sh does) or name it");
      }
    }
    if (!fs::is_directory(o_.fixtures + "/llama/model")) {
      return Status::Error(o_.fixtures + "/llama/model is missing; --fixtures names the tests/fixtures folder");
    }
    return Status::Ok();
  }

  Status MakeWorkDir() {
    if (!o_.work_dir.empty()) {
      std::error_code ec;
      fs::create_directories(o_.work_dir, ec);
      if (ec) return Status::Error("creating " + o_.work_dir + ": " + ec.message());
      dir_ = fs::absolute(o_.work_dir).lexically_normal().string();
      return Status::Ok();
    }
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/trainerd-daemon-bench.XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) return Status::Error("mkdtemp " + pattern + ": " + std::strerror(errno));
    dir_ = pattern;
    return Status::Ok();
  }

  Status Fill() {
    Progress("filling queue.db with " + std::to_string(o_.jobs) + " jobs through JobStore");
    FillOptions f;
    f.state_dir = dir_ + "/state";
    f.fixtures = o_.fixtures;
    f.jobs = o_.jobs;
    f.queued = o_.queued;
    f.log_every = o_.log_every;
    f.owner_uid = ::getuid();
    f.seed = o_.seed;
    TRAINERD_ASSIGN_OR_RETURN(fill_, FillQueue(f));
    json by_state = json::object();
    for (const auto& [state, n] : fill_.jobs_by_state) by_state[state] = n;
    // What trainerd's start reads (main.cc: JobStore::Open, then JobRegistry::Load
    // lists every job without its spec), timed here alone: its share of "ready in".
    for (int i = 0; i < 3; ++i) {
      const auto start = Clock::now();
      TRAINERD_ASSIGN_OR_RETURN(daemon::JobStore store, daemon::JobStore::Open(dir_ + "/state/queue.db"));
      TRAINERD_ASSIGN_OR_RETURN(std::vector<daemon::JobRecord> jobs,
                                store.List(/*include_ended=*/true, {}, daemon::JobStore::ListDetail::kWithoutSpec));
      store_load_ms_.push_back(MsSince(start));
    }
    results_["fill"] = {{"jobs", o_.jobs},
                        {"by_state", by_state},
                        {"prepare_seconds", fill_.prepare_seconds},
                        {"store_seconds", fill_.store_seconds},
                        {"transactions", fill_.transactions},
                        {"ms_per_transaction", 1000 * fill_.store_seconds / static_cast<double>(fill_.transactions)},
                        {"mean_spec_yaml_bytes", static_cast<double>(fill_.spec_yaml_bytes) / static_cast<double>(o_.jobs)},
                        {"queue_db_bytes", fill_.queue_db_bytes},
                        {"store_open_and_list_ms", store_load_ms_}};
    return Status::Ok();
  }

  Status StartUps(Daemon& daemon) {
    json starts = json::array();
    for (int i = 1; i <= o_.starts; ++i) {
      Progress("start " + std::to_string(i) + "/" + std::to_string(o_.starts));
      TRAINERD_ASSIGN_OR_RETURN(Daemon::StartTimes t, daemon.Start());
      accepts_.push_back(t.accepts_ms);
      first_status_.push_back(t.first_status_ms);
      if (t.ready_log_ms >= 0) ready_log_.push_back(t.ready_log_ms);
      json entry = {{"accepts_ms", t.accepts_ms}, {"first_status_ms", t.first_status_ms},
                    {"ready_log_ms", t.ready_log_ms}};
      // The head queued job started with the daemon: let it train, so the stop checkpoints a worker.
      TRAINERD_ASSIGN_OR_RETURN(std::vector<proto::Job> started, RunningJobs(daemon.socket()));
      TRAINERD_RETURN_IF_ERROR(WaitUntil(daemon.socket(), "the head queued job trains", std::chrono::minutes(3),
                                         [&](const std::vector<proto::Job>& now) {
                                           return SomeJobAdvanced(started, now);
                                         })
                                   .WithContext("start " + std::to_string(i) + " (log " + daemon.log_path() + ")"));
      if (i < o_.starts) {
        TRAINERD_ASSIGN_OR_RETURN(double stop_ms, daemon.Stop());
        stops_.push_back(stop_ms);
        entry["stop_ms"] = stop_ms;
      }
      starts.push_back(entry);
    }
    results_["startup"] = {{"starts", starts}};
    return Status::Ok();
  }

  // Submits the long job above the queue and cancels what runs, so that it runs next; its id.
  StatusOr<int64_t> StartRunningJob(Daemon& daemon) {
    Progress("submitting the long-running job");
    FixtureJob job;
    job.name = "daemon-bench-running";
    job.fixtures = o_.fixtures;
    job.output_dir = dir_ + "/running-job/output";
    job.log_every = o_.log_every;
    const std::string path = dir_ + "/running-job.yaml";
    std::ofstream(path) << FixtureJobYaml(job);
    proto::Request submit;
    submit.mutable_submit()->mutable_spec()->set_yaml(FixtureJobYaml(job));
    submit.mutable_submit()->mutable_spec()->set_source(path);
    submit.mutable_submit()->mutable_spec()->set_base_dir(dir_);
    submit.mutable_submit()->set_name(job.name);
    submit.mutable_submit()->set_priority(100);
    TRAINERD_ASSIGN_OR_RETURN(TimedReply submitted, CallOnce(daemon.socket(), submit));
    const int64_t id = submitted.reply.submit().job_id();
    if (id <= 0) return Status::Error("trainerd accepted the running job but sent no job id");

    TRAINERD_ASSIGN_OR_RETURN(std::vector<proto::Job> running, RunningJobs(daemon.socket()));
    proto::Request cancel;
    for (const proto::Job& j : running) {
      if (j.id() != id) cancel.mutable_cancel()->add_job_ids(j.id());
    }
    if (cancel.cancel().job_ids_size() > 0) TRAINERD_RETURN_IF_ERROR(CallOnce(daemon.socket(), cancel).status());
    TRAINERD_RETURN_IF_ERROR(WaitUntil(daemon.socket(), "job " + std::to_string(id) + " trains",
                                       std::chrono::minutes(3), [id](const std::vector<proto::Job>& jobs) {
                                         return jobs.size() == 1 && jobs[0].id() == id && jobs[0].progress().step() > 0;
                                       })
                                 .WithContext("log " + daemon.log_path()));
    results_["running_job"] = {{"id", id}, {"log_every", o_.log_every}};
    return id;
  }

  Status Latencies(Daemon& daemon, int64_t running) {
    results_["load_average_before"] = LoadAverage();
    Measurer m(o_, daemon, running, o_.jobs + 1);
    Progress("measuring trainerd's background load (the running job's events)");
    TRAINERD_ASSIGN_OR_RETURN(background_, m.MeasureBackground());
    results_["background"] = {{"daemon_cpu_ms_per_s", background_.daemon_cpu_ms_per_s},
                              {"running_job_steps_per_s", background_.steps_per_s},
                              {"progress_events_per_s", background_.steps_per_s / static_cast<double>(o_.log_every)}};

    auto add = [&](StatusOr<Series> s) -> Status {
      TRAINERD_RETURN_IF_ERROR(s.status());
      series_.push_back(std::move(s).value());
      return Status::Ok();
    };
    const std::string n = std::to_string(o_.jobs + 1);
    Progress("status JOB x" + std::to_string(o_.status_calls));
    TRAINERD_RETURN_IF_ERROR(add(m.ViaLibrary("status JOB (random of " + n + ")", o_.status_calls,
                                              [&] { return StatusRequest(m.RandomId()); })));
    Progress("list x" + std::to_string(o_.list_calls));
    TRAINERD_RETURN_IF_ERROR(add(m.ViaLibrary("list (active jobs)", o_.list_calls, [] { return ListRequest(false); })));
    Progress("list --all x" + std::to_string(o_.list_all_calls));
    TRAINERD_RETURN_IF_ERROR(
        add(m.ViaLibrary("list --all (" + n + " jobs)", o_.list_all_calls, [] { return ListRequest(true); })));
    Progress("trainctl status JOB --json x" + std::to_string(o_.ctl_status_calls));
    TRAINERD_RETURN_IF_ERROR(add(m.ViaTrainctl("trainctl status JOB --json", o_.ctl_status_calls, [&] {
      return std::vector<std::string>{"status", std::to_string(m.RandomId()), "--json"};
    })));
    Progress("trainctl list x" + std::to_string(o_.ctl_list_calls));
    TRAINERD_RETURN_IF_ERROR(add(m.ViaTrainctl("trainctl list", o_.ctl_list_calls, [] {
      return std::vector<std::string>{"list"};
    })));
    Progress("trainctl list --all x" + std::to_string(o_.ctl_list_all_calls));
    TRAINERD_RETURN_IF_ERROR(add(m.ViaTrainctl("trainctl list --all", o_.ctl_list_all_calls, [] {
      return std::vector<std::string>{"list", "--all"};
    })));

    json series = json::array();
    for (const Series& s : series_) {
      json j = {{"name", s.name}, {"via", s.via}, {"latency", SummaryJson(s.total)}};
      if (s.via == "client library") {
        j["connect"] = SummaryJson(s.connect);
        j["mean_reply_bytes"] = s.mean_reply_bytes;
        j["jobs_in_reply"] = s.max_jobs_in_reply;
        j["client_parse_ms"] = s.client_parse_ms;
      }
      j["daemon_cpu_ms_per_call"] = s.daemon_cpu_ms_per_call;
      j["running_job_step"] = {s.step_before, s.step_after};
      j["seconds"] = s.seconds;
      series.push_back(j);
    }
    results_["latency"] = series;
    results_["load_average_after"] = LoadAverage();
    return Status::Ok();
  }

  void Report() {
    const Spread accepts = SpreadOf(accepts_), first = SpreadOf(first_status_), ready = SpreadOf(ready_log_),
                 stops = SpreadOf(stops_);
    results_["startup"]["accepts_ms"] = {{"min", accepts.min}, {"median", accepts.median}, {"max", accepts.max}};
    results_["startup"]["first_status_ms"] = {{"min", first.min}, {"median", first.median}, {"max", first.max}};
    results_["startup"]["ready_log_ms"] = {{"min", ready.min}, {"median", ready.median}, {"max", ready.max}};
    results_["startup"]["stop_ms"] = {{"min", stops.min}, {"median", stops.median}, {"max", stops.max}};

    const json& machine = results_["machine"];
    std::printf("\n## trainerd with %" PRId64 " jobs, one running\n\n", o_.jobs);
    std::printf("Machine: %s, %s CPUs, %s, %s; 1-minute load average %.2f before the latency series, %.2f "
                "after.\n",
                machine.value("cpu", "?").c_str(), std::to_string(machine.value("cpus_online", 0)).c_str(),
                machine.value("kernel", "?").c_str(), machine.value("os", "?").c_str(),
                results_.value("load_average_before", -1.0), results_.value("load_average_after", -1.0));
    std::string states;
    for (const auto& [state, count] : fill_.jobs_by_state) {
      states += (states.empty() ? "" : ", ") + std::to_string(count) + " " + state;
    }
    std::printf("\nQueue: %s; spec_yaml %.0f bytes on average; queue.db %.1f MB.\n", states.c_str(),
                static_cast<double>(fill_.spec_yaml_bytes) / static_cast<double>(o_.jobs),
                static_cast<double>(fill_.queue_db_bytes) / 1e6);
    std::printf("Fill (not part of the goal): %" PRId64 " JobStore calls in %.1f s (%.2f ms each, one fsynced "
                "transaction per call), after %.1f s building the rows.\n",
                fill_.transactions, fill_.store_seconds, 1000 * fill_.store_seconds / static_cast<double>(fill_.transactions),
                fill_.prepare_seconds);

    std::printf("\n| start-up, %d starts (ms) | min | median | max |\n|---|---:|---:|---:|\n", o_.starts);
    auto row3 = [](const char* what, const Spread& s) {
      std::printf("| %s | %.1f | %.1f | %.1f |\n", what, s.min, s.median, s.max);
    };
    row3("spawn → socket accepts", accepts);
    row3("spawn → first `status` answered", first);
    row3("trainerd's own \"ready in\" (store open, recovery, registry load, listen)", ready);
    if (!stops_.empty()) row3("SIGTERM → exit (its worker checkpoints first)", stops);
    row3("of \"ready in\": JobStore::Open + List of every job without spec, alone in this process",
         SpreadOf(store_load_ms_));

    std::printf("\nWhile job %s trains (%.0f steps/s, log_every %" PRId64 ": %.1f progress events/s; trainerd uses "
                "%.1f ms CPU/s for them):\n\n",
                std::to_string(results_["running_job"].value("id", int64_t{0})).c_str(), background_.steps_per_s,
                o_.log_every, background_.steps_per_s / static_cast<double>(o_.log_every),
                background_.daemon_cpu_ms_per_s);
    std::printf("| request, a fresh connection each | via | calls | p50 ms | p90 ms | p99 ms | max ms | reply bytes | "
                "trainerd CPU ms/call |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const Series& s : series_) {
      const std::string bytes = s.via == "client library" ? Fixed(s.mean_reply_bytes, 0) : "";
      std::printf("| %s | %s | %zu | %.2f | %.2f | %.2f | %.2f | %s | %.2f |\n", s.name.c_str(), s.via.c_str(),
                  s.total.count, s.total.p50, s.total.p90, s.total.p99, s.total.max, bytes.c_str(),
                  s.daemon_cpu_ms_per_call);
    }
    for (const Series& s : series_) {
      if (s.via == "client library" && s.max_jobs_in_reply > 1000) {
        std::printf("\n%s: the reply holds %" PRId64 " jobs (%.1f MB); parsing it again in the client takes %.2f ms; "
                    "connecting %.3f ms (p50).\n",
                    s.name.c_str(), s.max_jobs_in_reply, s.mean_reply_bytes / 1e6, s.client_parse_ms, s.connect.p50);
      }
    }

    // The goals: every client-library series' p99, and every start.
    json goals = json::object();
    std::printf("\nGoals:");
    for (const Series& s : series_) {
      if (s.via != "client library") continue;
      const bool met = s.total.p99 < kLatencyGoalMs;
      goals[s.name] = {{"p99_ms", s.total.p99}, {"goal_ms", kLatencyGoalMs}, {"met", met}};
      std::printf(" %s p99 %.2f ms %s;", s.name.c_str(), s.total.p99, met ? "< 10 ms: met" : ">= 10 ms: NOT met");
    }
    const bool start_met = first.max < kStartGoalMs;
    goals["start-up"] = {{"max_first_status_ms", first.max}, {"goal_ms", kStartGoalMs}, {"met", start_met}};
    std::printf(" start-up (slowest of %d, to the first status) %.0f ms %s.\n", o_.starts, first.max,
                start_met ? "< 1 s: met" : ">= 1 s: NOT met");
    results_["goals"] = goals;
  }

  Options o_;
  std::string dir_;
  json results_;
  FillResult fill_;
  std::vector<double> accepts_, first_status_, ready_log_, stops_, store_load_ms_;
  Background background_;
  std::vector<Series> series_;
};

}  // namespace
}  // namespace trainerd::bench

int main(int argc, char** argv) {
  using trainerd::bench::Options;
  Options o;
  CLI::App app{"daemon_bench: trainerd's start-up time and status/list latency with a large queue and a job "
               "running (bench/README.md)."};
  app.add_option("--trainerd", o.trainerd, "the trainerd binary")->capture_default_str();
  app.add_option("--trainctl", o.trainctl, "the trainctl binary")->capture_default_str();
  app.add_option("--worker", o.worker, "the trainerd-worker binary trainerd runs jobs with")->capture_default_str();
  app.add_option("--fixtures", o.fixtures, "the tests/fixtures folder (the tiny Llama model and data)")
      ->capture_default_str();
  app.add_option("--work-dir", o.work_dir, "folder for the state, socket and logs (default: a new one in $TMPDIR)");
  app.add_option("--json", o.json_path, "write the figures here (empty: nowhere)")->capture_default_str();
  app.add_option("--jobs", o.jobs, "jobs in the store")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{10000000}));
  app.add_option("--queued", o.queued, "of them still queued (the newest)")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{10000000}));
  app.add_option("--starts", o.starts, "trainerd starts timed")->capture_default_str()->check(CLI::Range(1, 1000));
  app.add_option("--status-calls", o.status_calls, "status calls timed")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--list-calls", o.list_calls, "list calls timed")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--list-all-calls", o.list_all_calls, "list --all calls timed")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--ctl-status-calls", o.ctl_status_calls, "trainctl status runs timed")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--ctl-list-calls", o.ctl_list_calls, "trainctl list runs timed")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--ctl-list-all-calls", o.ctl_list_all_calls, "trainctl list --all runs timed")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--log-every", o.log_every, "training.log_every of the running job (a progress event per N steps)")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  app.add_option("--worker-threads", o.worker_threads,
                 "OMP_NUM_THREADS for the workers (0: LibTorch's default, a thread per core)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--baseline-seconds", o.baseline_seconds, "how long trainerd's background CPU is measured")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "of the queue's contents and the status ids")->capture_default_str();
  app.add_flag("--keep", o.keep, "keep the working folder (state, logs)");
  CLI11_PARSE(app, argc, argv);
  if (o.queued >= o.jobs) {
    std::fprintf(stderr, "daemon_bench: error: --queued (%lld) must be below --jobs (%lld)\n",
                 static_cast<long long>(o.queued), static_cast<long long>(o.jobs));
    return 2;
  }

  trainerd::bench::Benchmark bench(std::move(o));
  const trainerd::Status status = bench.Run();
  bench.CleanUp(status.ok());
  if (!status.ok()) {
    std::fprintf(stderr, "daemon_bench: error: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
