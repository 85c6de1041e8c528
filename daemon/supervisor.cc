#include "daemon/supervisor.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <sstream>
#include <utility>

#include <spdlog/spdlog.h>

#include "common/framing.h"
#include "common/log_setup.h"
#include "common/proto_framing.h"
#include "common/short_count.h"
#include "common/utf8_text.h"
#include "daemon/child_process.h"
#include "proto/trainerd.pb.h"

namespace trainerd::daemon {
namespace {

namespace asio = boost::asio;

constexpr int kExitStopped = 75;          // trainerd-worker: stopped after a checkpoint
constexpr size_t kLastLinesKept = 20;     // of a worker's output, for a failed job's reason
constexpr size_t kLastLinesInReason = 10;
// After a worker exits, how long its output may stay open (a grandchild holding
// the pipe) before the job is concluded anyway.
constexpr std::chrono::seconds kOutputDrainLimit{5};
constexpr size_t kMaxLogLineBytes = 64 << 10;  // longer output lines are split

int64_t SystemNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string JobName(int64_t id) { return "job " + std::to_string(id); }

// The GPU index for CUDA_VISIBLE_DEVICES of device "cuda:N": the N-th entry of
// trainerd's own CUDA_VISIBLE_DEVICES when it has one, else N.
std::string VisibleDevice(const std::string& device) {
  const std::string index = device.substr(5);
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr || *visible == '\0') return index;
  std::vector<std::string> entries;
  std::stringstream ss(visible);
  for (std::string e; std::getline(ss, e, ',');) entries.push_back(e);
  const size_t n = static_cast<size_t>(std::stoul(index));
  return n < entries.size() ? entries[n] : index;
}

JobProgress ProgressFrom(const proto::Progress& p) {
  JobProgress out;
  out.step = p.step();
  out.total_steps = p.total_steps();
  out.epoch = p.epoch();
  out.loss = p.loss();
  out.learning_rate = p.learning_rate();
  out.grad_norm = p.grad_norm();
  out.tokens_per_second = p.tokens_per_second();
  out.mfu = p.mfu();
  out.peak_memory_bytes = p.peak_memory_bytes();
  out.elapsed_seconds = p.elapsed_seconds();
  out.eta_seconds = p.eta_seconds();
  out.eval_loss = p.eval_loss();
  return out;
}

}  // namespace

struct Supervisor::Worker {
  Worker(asio::io_context& io, int output_fd, int events_fd)
      : output(io, output_fd), events(io, events_fd), kill_timer(io), drain_timer(io) {}

  enum class Stop { kNone, kCancel, kShutdown };

  int64_t job_id = 0;
  std::string device;
  pid_t pid = -1;
  asio::posix::stream_descriptor output;
  asio::posix::stream_descriptor events;
  std::array<char, 64 << 10> output_buffer;
  std::array<char, 64 << 10> events_buffer;
  std::string partial_line;
  FrameDecoder decoder;
  bool output_done = false;
  bool events_done = false;
  bool exited = false;
  int wait_status = 0;
  Stop stop = Stop::kNone;
  std::string stop_reason;
  asio::steady_timer kill_timer;   // SIGKILL when the grace runs out
  asio::steady_timer drain_timer;  // conclude without the rest of the output
  std::deque<std::string> last_lines;
  std::optional<proto::WorkerEvent::Finished> finished;
  int64_t checkpoint_step = 0;
  bool concluded = false;
};

// `trainerd-worker devices`, run once at start (and after a reload that clears gpus).
struct Supervisor::DeviceQuery {
  DeviceQuery(asio::io_context& io, int fd) : output(io, fd) {}
  pid_t pid = -1;
  asio::posix::stream_descriptor output;
  std::array<char, 4096> buffer;
  std::string text;
  bool output_done = false;
  bool exited = false;
  int wait_status = 0;
};

Supervisor::Worker* Supervisor::FindWorker(int64_t id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : it->second.get();
}

Supervisor::Supervisor(asio::io_context& io, JobRegistry& jobs, JobLogs& logs, SupervisorConfig config,
                       Clock now_unix_ms)
    : io_(io),
      jobs_(jobs),
      logs_(logs),
      config_(std::move(config)),
      now_unix_ms_(now_unix_ms ? std::move(now_unix_ms) : Clock(SystemNowMs)),
      child_signal_(io, SIGCHLD) {}

Supervisor::~Supervisor() {
  for (auto& [id, worker] : workers_) {
    if (!worker->exited) ::kill(-worker->pid, SIGKILL);
  }
  if (device_query_ && !device_query_->exited) ::kill(-device_query_->pid, SIGKILL);
}

void Supervisor::Start() {
  if (started_) return;
  started_ = true;
  WaitForSignal();
  if (config_.gpus.empty()) {
    DiscoverDevices();
  } else {
    SetDevices(config_.gpus);
  }
}

void Supervisor::Reconfigure(SupervisorConfig config) {
  const bool gpus_changed = config.gpus != config_.gpus;
  config_ = std::move(config);
  if (!started_ || !gpus_changed) return;
  if (config_.gpus.empty()) {
    DiscoverDevices();
  } else {
    SetDevices(config_.gpus);
  }
}

void Supervisor::SetDevices(std::vector<std::string> devices) {
  devices_ = std::move(devices);
  devices_known_ = true;
  std::string list;
  for (const std::string& d : devices_) list += (list.empty() ? "" : ", ") + d;
  spdlog::info("jobs run on: {}", list);
  Schedule();
  Changed();
}

void Supervisor::DiscoverDevices() {
  if (device_query_) return;  // one already runs; its answer will do
  ChildSpec spec;
  spec.argv = {config_.worker_path, "devices"};
  StatusOr<Child> child = SpawnChild(spec);
  if (!child.ok()) {
    spdlog::error("cannot ask {} for the GPUs: {}; jobs run on the CPU (set gpus: in the config to choose)",
                  config_.worker_path, child.status().message());
    SetDevices({"cpu"});
    return;
  }
  device_query_ = std::make_unique<DeviceQuery>(io_, child->output_fd);
  device_query_->pid = child->pid;
  ReadDeviceQuery();
}

void Supervisor::ReadDeviceQuery() {
  DeviceQuery& q = *device_query_;
  q.output.async_read_some(asio::buffer(q.buffer), [this, alive = std::weak_ptr<char>(alive_)](
                                                       const boost::system::error_code& ec, size_t n) {
    if (alive.expired() || !device_query_) return;
    DeviceQuery& q = *device_query_;
    if (ec) {
      q.output_done = true;
      OnChildSignal();  // conclude if it has exited already
      return;
    }
    q.text.append(q.buffer.data(), n);
    ReadDeviceQuery();
  });
}

void Supervisor::WaitForSignal() {
  child_signal_.async_wait([this, alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& ec, int) {
    if (ec || alive.expired()) return;
    OnChildSignal();
    // The last worker's end may have finished the shutdown (FinishShutdown,
    // from inside OnChildSignal): then nothing is left to reap or to wait for.
    if (!shutdown_finished_) WaitForSignal();
  });
}

void Supervisor::OnChildSignal() {
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    if (device_query_ && device_query_->pid == pid) {
      device_query_->exited = true;
      device_query_->wait_status = status;
      continue;
    }
    for (auto& [id, worker] : workers_) {
      if (worker->pid != pid) continue;
      worker->exited = true;
      worker->wait_status = status;
      worker->kill_timer.cancel();
      // Output still held open (a grandchild): conclude without it after a while.
      worker->drain_timer.expires_after(kOutputDrainLimit);
      worker->drain_timer.async_wait(
          [this, id = id, alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& ec) {
            if (ec || alive.expired()) return;
            Worker* w = FindWorker(id);
            if (w == nullptr) return;
            w->output_done = w->events_done = true;
            MaybeConclude(id);
          });
      break;
    }
  }
  // Conclusions after the loop: they may start new children.
  if (device_query_ && device_query_->exited && device_query_->output_done) {
    std::unique_ptr<DeviceQuery> q = std::move(device_query_);
    std::vector<std::string> found;
    std::stringstream ss(q->text);
    bool garbled = false;
    for (std::string line; std::getline(ss, line);) {
      if (line == "cpu" || line.rfind("cuda:", 0) == 0) {
        if (line != "cpu") found.push_back(line);
      } else if (!line.empty()) {
        garbled = true;
      }
    }
    if (!WIFEXITED(q->wait_status) || WEXITSTATUS(q->wait_status) != 0 || garbled) {
      spdlog::error("{} devices {}: {}; jobs run on the CPU (set gpus: in the config to choose)",
                    config_.worker_path, DescribeWaitStatus(q->wait_status), q->text);
      found.clear();
    }
    if (found.empty()) found.push_back("cpu");
    if (config_.gpus.empty()) SetDevices(std::move(found));
  }
  std::vector<int64_t> ids;
  for (auto& [id, worker] : workers_) ids.push_back(id);
  for (int64_t id : ids) MaybeConclude(id);
}

void Supervisor::Schedule() {
  if (!devices_known_ || stopping_) return;
  for (const std::string& device : devices_) {
    bool busy = false;
    for (const auto& [id, worker] : workers_) busy = busy || worker->device == device;
    if (busy) continue;
    const JobRecord* next = jobs_.NextQueued();
    if (next == nullptr) return;
    StartJob(*next, device);
  }
}

void Supervisor::StartJob(const JobRecord& queued, const std::string& device) {
  const int64_t id = queued.id;
  Status status = jobs_.MarkRunning(id, device, now_unix_ms_());
  if (!status.ok()) {
    spdlog::error("{}cannot start: {}", JobLogPrefix(id), status.message());
    return;
  }
  const JobRecord job = *jobs_.Find(id);
  const std::string dir = config_.state_dir + "/jobs/" + std::to_string(id);
  const std::string log_path = job.log_path.empty() ? dir + "/log" : job.log_path;
  Status opened = logs_.Open(id, log_path);
  if (!opened.ok()) spdlog::warn("{}{}", JobLogPrefix(id), opened.message());

  auto fail = [&](const std::string& why) {
    spdlog::error("{}cannot start its worker: {}", JobLogPrefix(id), why);
    Note(id, "cannot start the worker: " + why);
    Status s = jobs_.Finish(id, JobState::kFailed, JobResult{}, "trainerd could not start the worker: " + why,
                            now_unix_ms_());
    if (!s.ok()) spdlog::error("{}{}", JobLogPrefix(id), s.message());
    logs_.Close(id);
  };

  ChildSpec spec;
  spec.argv = {config_.worker_path,
               "run",
               dir + "/job.yaml",
               "--events-fd",
               "3",
               "--base-dir",
               job.spec_base_dir,
               "--source",
               job.spec_source.empty() ? "job.yaml" : job.spec_source,
               "--output-dir",
               job.output_dir.empty() ? dir + "/output" : job.output_dir,
               "--device",
               device == "cpu" ? "cpu" : "cuda:0"};
  if (job.attempt > 1) spec.argv.push_back("--resume");
  if (config_.checkpoint_every > 0) {
    spec.argv.push_back("--checkpoint-every");
    spec.argv.push_back(std::to_string(config_.checkpoint_every));
  }
  if (device != "cpu") spec.env["CUDA_VISIBLE_DEVICES"] = VisibleDevice(device);
  spec.working_dir = dir;

  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    fail(std::string("socketpair: ") + std::strerror(errno));
    return;
  }
  spec.fd3 = pair[1];
  StatusOr<Child> child = SpawnChild(spec);
  ::close(pair[1]);
  if (!child.ok()) {
    ::close(pair[0]);
    fail(child.status().message());
    return;
  }
  auto worker = std::make_unique<Worker>(io_, child->output_fd, pair[0]);
  worker->job_id = id;
  worker->device = device;
  worker->pid = child->pid;
  workers_[id] = std::move(worker);
  const std::string attempt =
      job.attempt > 1 ? "attempt " + std::to_string(job.attempt) + ", resuming from its last checkpoint"
                      : "attempt 1";
  spdlog::info("{}started on {} ({}), worker pid {}", JobLogPrefix(id), device, attempt, child->pid);
  Note(id, "started on " + device + " (" + attempt + ")");
  ReadOutput(id);
  ReadEvents(id);
  Changed();
}

void Supervisor::ReadOutput(int64_t id) {
  Worker* found = FindWorker(id);
  if (found == nullptr) return;
  Worker& w = *found;
  w.output.async_read_some(
      asio::buffer(w.output_buffer),
      [this, id, alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& ec, size_t n) {
        if (alive.expired()) return;
        Worker* found = FindWorker(id);
        if (found == nullptr) return;
        Worker& w = *found;
        if (ec) {
          if (!w.partial_line.empty()) OnOutputLine(w, w.partial_line);
          w.partial_line.clear();
          w.output_done = true;
          MaybeConclude(id);
          return;
        }
        size_t start = 0;
        const char* data = w.output_buffer.data();
        for (size_t i = 0; i < n; ++i) {
          if (data[i] != '\n') continue;
          w.partial_line.append(data + start, i - start);
          OnOutputLine(w, w.partial_line);
          w.partial_line.clear();
          start = i + 1;
        }
        w.partial_line.append(data + start, n - start);
        if (w.partial_line.size() > kMaxLogLineBytes) {
          OnOutputLine(w, w.partial_line);
          w.partial_line.clear();
        }
        ReadOutput(id);
      });
}

void Supervisor::OnOutputLine(Worker& worker, const std::string& line) {
  // Valid UTF-8 (bad bytes become U+FFFD): log lines and reasons travel in protobuf strings.
  std::string text = ValidUtf8(line);
  if (!text.empty() && text.back() == '\r') text.pop_back();
  Status s = logs_.Append(worker.job_id, text);
  if (!s.ok()) spdlog::warn("{}{}", JobLogPrefix(worker.job_id), s.message());
  spdlog::debug("{}{}", JobLogPrefix(worker.job_id), text);
  worker.last_lines.push_back(std::move(text));
  if (worker.last_lines.size() > kLastLinesKept) worker.last_lines.pop_front();
}

void Supervisor::ReadEvents(int64_t id) {
  Worker* found = FindWorker(id);
  if (found == nullptr) return;
  Worker& w = *found;
  w.events.async_read_some(
      asio::buffer(w.events_buffer),
      [this, id, alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& ec, size_t n) {
        if (alive.expired()) return;
        Worker* found = FindWorker(id);
        if (found == nullptr) return;
        Worker& w = *found;
        if (ec) {
          w.events_done = true;
          MaybeConclude(id);
          return;
        }
        w.decoder.Feed(w.events_buffer.data(), n);
        while (true) {
          StatusOr<std::optional<std::string>> frame = w.decoder.Next();
          if (!frame.ok()) {
            spdlog::warn("{}events from its worker: {}; progress is no longer shown", JobLogPrefix(id),
                         frame.status().message());
            w.events_done = true;
            boost::system::error_code ignored;
            w.events.close(ignored);
            MaybeConclude(id);
            return;
          }
          if (!frame->has_value()) break;
          OnEvent(w, **frame);
        }
        ReadEvents(id);
      });
}

void Supervisor::OnEvent(Worker& worker, const std::string& payload) {
  proto::WorkerEvent event;
  if (!ParseFrame(payload, &event).ok()) {
    spdlog::warn("{}an unreadable event from its worker ({} bytes), ignored", JobLogPrefix(worker.job_id),
                 payload.size());
    return;
  }
  const int64_t id = worker.job_id;
  const JobRecord* job = jobs_.Find(id);
  if (job == nullptr) return;
  JobProgress progress = job->progress;
  switch (event.kind_case()) {
    case proto::WorkerEvent::kStarted:
      progress.total_steps = event.started().total_steps();
      if (event.started().resumed_from_step() > 0) progress.step = event.started().resumed_from_step();
      break;
    case proto::WorkerEvent::kProgress: {
      const double eval_loss = progress.eval_loss;
      progress = ProgressFrom(event.progress());
      if (progress.eval_loss == 0) progress.eval_loss = eval_loss;
      break;
    }
    case proto::WorkerEvent::kEval:
      progress.eval_loss = event.eval().eval_loss();
      break;
    case proto::WorkerEvent::kCheckpoint:
      worker.checkpoint_step = event.checkpoint().step();
      return;
    case proto::WorkerEvent::kFinished:
      worker.finished = event.finished();
      return;
    case proto::WorkerEvent::kLogLine:  // the same text reaches the log through its stderr
    case proto::WorkerEvent::KIND_NOT_SET:
      return;
  }
  Status s = jobs_.UpdateProgress(id, progress);
  if (!s.ok()) spdlog::warn("{}{}", JobLogPrefix(id), s.message());
  Changed(/*progress_only=*/true);
}

Status Supervisor::Cancel(int64_t id, const std::string& reason) {
  Worker* found = FindWorker(id);
  if (found == nullptr) return Status::Error(JobName(id) + " has no running worker");
  Worker& w = *found;
  if (w.stop != Worker::Stop::kCancel) {
    w.stop = Worker::Stop::kCancel;
    w.stop_reason = reason;
    Note(id, reason + "; stopping the worker");
    StopWorker(w);
  }
  return Status::Ok();
}

void Supervisor::StopWorker(Worker& worker) {
  if (worker.exited) return;
  ::kill(-worker.pid, SIGTERM);
  worker.kill_timer.expires_after(std::chrono::seconds(config_.stop_grace_seconds));
  worker.kill_timer.async_wait(
      [this, id = worker.job_id, alive = std::weak_ptr<char>(alive_)](const boost::system::error_code& ec) {
        if (ec || alive.expired()) return;
        Worker* w = FindWorker(id);
        if (w == nullptr || w->exited) return;
        spdlog::warn("{}its worker did not stop within {} s of SIGTERM; sending SIGKILL", JobLogPrefix(id),
                     config_.stop_grace_seconds);
        Note(id, "the worker did not stop within " + std::to_string(config_.stop_grace_seconds) +
                     " s (stop_grace_seconds); killed with SIGKILL");
        ::kill(-w->pid, SIGKILL);
      });
}

void Supervisor::Shutdown(std::function<void()> done) {
  stopping_ = true;
  shutdown_done_ = std::move(done);
  if (device_query_ && !device_query_->exited) ::kill(-device_query_->pid, SIGKILL);
  for (auto& [id, worker] : workers_) {
    if (worker->stop == Worker::Stop::kNone) {
      worker->stop = Worker::Stop::kShutdown;
      Note(id, "trainerd is stopping: asking the worker to checkpoint and exit");
    }
    StopWorker(*worker);
  }
  if (workers_.empty()) FinishShutdown();
}

void Supervisor::FinishShutdown() {
  if (!shutdown_done_) return;
  shutdown_finished_ = true;
  child_signal_.cancel();  // nothing left to reap: let the io_context run out of work
  auto callback = std::move(shutdown_done_);
  shutdown_done_ = nullptr;
  asio::post(io_, std::move(callback));
}

void Supervisor::MaybeConclude(int64_t id) {
  auto it = workers_.find(id);  // the iterator, not FindWorker: the worker leaves the map here
  if (it == workers_.end()) return;
  Worker& w = *it->second;
  if (w.concluded || !w.exited || !w.output_done || !w.events_done) return;
  w.concluded = true;
  std::unique_ptr<Worker> worker = std::move(it->second);
  workers_.erase(it);
  Conclude(*worker);
  Changed();
  if (stopping_) {
    if (workers_.empty()) FinishShutdown();
    return;
  }
  Schedule();
}

void Supervisor::Conclude(Worker& w) {
  const int64_t id = w.job_id;
  const int st = w.wait_status;
  const std::string how = DescribeWaitStatus(st);
  const bool exited_ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
  const bool stopped = WIFEXITED(st) && WEXITSTATUS(st) == kExitStopped;
  JobResult result;
  if (WIFEXITED(st)) result.exit_code = WEXITSTATUS(st);
  if (WIFSIGNALED(st)) result.signal = WTERMSIG(st);
  if (w.finished) {
    result.output_path = w.finished->output_path();
    result.eval_loss = w.finished->eval_loss();
  }
  JobState state;
  std::string reason;
  if (w.stop == Worker::Stop::kCancel) {
    state = JobState::kCancelled;
    reason = w.stop_reason;
  } else if (w.stop == Worker::Stop::kShutdown) {
    state = JobState::kInterrupted;
    reason = stopped ? "stopped by trainerd's shutdown after a checkpoint; resumes when trainerd starts"
                     : "trainerd's shutdown stopped the worker (" + how +
                           "); resumes from its last checkpoint when trainerd starts";
  } else if (exited_ok) {
    state = JobState::kSucceeded;
  } else {
    state = JobState::kFailed;
    if (w.finished && !w.finished->error().empty()) {
      reason = ValidUtf8(w.finished->error());
    } else if (stopped) {
      reason = "the worker was stopped by a signal from outside trainerd (exit 75) after a checkpoint; "
               "submit the job again to continue";
    } else {
      reason = "the worker " + how;
      if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
        reason += " (by someone, or by the kernel's out-of-memory killer: see `journalctl -k`)";
      }
      if (!w.last_lines.empty()) {
        reason += "; its last lines:";
        const size_t first = w.last_lines.size() > kLastLinesInReason ? w.last_lines.size() - kLastLinesInReason : 0;
        for (size_t i = first; i < w.last_lines.size(); ++i) reason += "\n  " + w.last_lines[i];
      }
    }
  }
  std::string summary = std::string(JobStateName(state)) + " (worker " + how + ")";
  if (state == JobState::kSucceeded && !result.output_path.empty()) summary += "; outputs in " + result.output_path;
  if (!reason.empty() && state != JobState::kFailed) summary += ": " + reason;
  if (state == JobState::kFailed) summary += ": " + reason.substr(0, reason.find('\n'));
  Note(id, summary);
  if (state == JobState::kFailed) {
    spdlog::warn("{}{}", JobLogPrefix(id), summary);
  } else {
    spdlog::info("{}{}", JobLogPrefix(id), summary);
  }
  // The summary is the log's last line: Finish ends the followers' streams.
  Status s = jobs_.Finish(id, state, result, reason, now_unix_ms_());
  if (!s.ok()) spdlog::error("{}recording its end: {}", JobLogPrefix(id), s.message());
  logs_.Close(id);
}

void Supervisor::Note(int64_t id, const std::string& text) {
  Status s = logs_.Append(id, "[trainerd] " + text);
  if (!s.ok()) spdlog::warn("{}{}", JobLogPrefix(id), s.message());
}

void Supervisor::Changed(bool progress_only) {
  if (on_change_) on_change_(progress_only);
}

std::string Supervisor::StatusLine() const {
  std::string line;
  for (const auto& [id, worker] : workers_) {
    const JobRecord* job = jobs_.Find(id);
    if (job == nullptr) continue;
    if (!line.empty()) line += "; ";
    line += JobName(id);
    if (job->progress.total_steps > 0) {
      line += " step " + std::to_string(job->progress.step) + "/" + std::to_string(job->progress.total_steps);
    } else {
      line += " starting";
    }
    if (job->progress.tokens_per_second > 0) line += " " + ShortCount(job->progress.tokens_per_second) + " tok/s";
    if (worker->stop != Worker::Stop::kNone) line += " (stopping)";
  }
  if (line.empty()) line = stopping_ ? "stopping" : (devices_known_ ? "idle" : "finding GPUs");
  line += ", " + std::to_string(jobs_.Count(JobState::kQueued)) + " queued";
  return line;
}

}  // namespace trainerd::daemon
