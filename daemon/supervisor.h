// The scheduler and the worker supervisor.
//
// Scheduling: one job per device at a time. The devices are the config's
// `gpus`, or when it lists none every GPU `trainerd-worker devices` reports,
// or the CPU when there is no GPU. A free device takes the next queued job
// (JobRegistry::NextQueued: highest priority, then FIFO).
//
// Each job runs in its own trainerd-worker process (daemon/child_process.h):
//   trainerd-worker run <job dir>/job.yaml --events-fd 3 --base-dir ... --source ...
//       --output-dir <job's output dir> --device cuda:0 [--resume] [--checkpoint-every N]
// with CUDA_VISIBLE_DEVICES naming its GPU. Its WorkerEvent frames arrive on
// fd 3 (a socketpair) and update the job's progress; its stdout and stderr
// become the job's log (daemon/job_logs.h), together with trainerd's own notes.
// A job ends when its worker has exited and its output is read to the end:
//   exit 0 → succeeded; cancelled by its owner → cancelled (whatever the exit);
//   stopped for trainerd's shutdown → interrupted (resumes at the next start);
//   anything else → failed, the reason naming the exit status or signal, the
//   worker's error and its last log lines.
// Attempts after the first run with --resume.
//
// Stopping a worker: SIGTERM to its process group (the worker finishes its
// step, writes a checkpoint and exits 75), then SIGKILL after stop_grace.
//
// Threading: every call on the io_context's thread, which must be the
// process's main thread (children get SIGTERM when the forking thread exits).
// The supervisor reaps children with a SIGCHLD signal_set: nothing else in
// the process may wait for children.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio.hpp>

#include "common/status.h"
#include "daemon/job_logs.h"
#include "daemon/job_registry.h"

namespace trainerd::daemon {

struct SupervisorConfig {
  std::string worker_path;               // the trainerd-worker binary
  std::string state_dir;                 // jobs' folders are <state_dir>/jobs/<id>
  std::vector<std::string> gpus;         // DaemonConfig::gpus: empty = discover
  int64_t stop_grace_seconds = 120;      // SIGTERM → SIGKILL
  int64_t checkpoint_every = 0;          // passed to workers when > 0
};

class Supervisor {
 public:
  using Clock = std::function<int64_t()>;  // now, Unix milliseconds

  // `jobs` and `logs` must outlive the supervisor. Nothing starts before Start().
  Supervisor(boost::asio::io_context& io, JobRegistry& jobs, JobLogs& logs, SupervisorConfig config,
             Clock now_unix_ms = {});
  ~Supervisor();  // kills (SIGKILL) any worker still running; call Shutdown first to stop them cleanly
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Finds the devices (asynchronously when it has to ask the worker) and then
  // starts queued jobs on them.
  void Start();
  // A reloaded config: the worker path, grace and checkpoint interval apply to
  // the next stop or start; a changed gpus list is found again and used as
  // devices free up (a running job keeps its device).
  void Reconfigure(SupervisorConfig config);
  // Starts queued jobs on free devices. Submitting a job calls it.
  void Schedule();
  // Stops running job `id`'s worker; the job then ends cancelled with `reason`.
  // An error when it does not run here.
  Status Cancel(int64_t id, const std::string& reason);
  // Stops every worker (each writes a checkpoint), marks their jobs
  // interrupted and calls `done` once none is left. No job starts afterwards.
  void Shutdown(std::function<void()> done);

  // Called (on the io thread) after anything STATUS shows changed:
  // progress_only when only a running job's figures did (frequent).
  void SetChangeListener(std::function<void(bool progress_only)> listener) { on_change_ = std::move(listener); }
  // One line for sd_notify's STATUS: "job 7 step 300/2400 8.1k tok/s, 3 queued".
  std::string StatusLine() const;

  // The devices jobs run on; empty until found.
  const std::vector<std::string>& devices() const { return devices_; }
  size_t running_count() const { return workers_.size(); }
  bool stopping() const { return stopping_; }

 private:
  struct Worker;
  struct DeviceQuery;

  // The running worker of job `id`, or nullptr (it has been concluded).
  Worker* FindWorker(int64_t id);
  void SetDevices(std::vector<std::string> devices);
  void DiscoverDevices();
  void ReadDeviceQuery();
  void StartJob(const JobRecord& job, const std::string& device);
  void ReadOutput(int64_t id);
  void ReadEvents(int64_t id);
  void OnOutputLine(Worker& worker, const std::string& line);
  void OnEvent(Worker& worker, const std::string& payload);
  void StopWorker(Worker& worker);
  void OnChildSignal();
  void WaitForSignal();
  // Ends the job once its worker exited and its output is read.
  void MaybeConclude(int64_t id);
  void Conclude(Worker& worker);
  void FinishShutdown();
  void Note(int64_t id, const std::string& text);  // a trainerd line in the job's log
  void Changed(bool progress_only = false);

  boost::asio::io_context& io_;
  JobRegistry& jobs_;
  JobLogs& logs_;
  SupervisorConfig config_;
  Clock now_unix_ms_;
  boost::asio::signal_set child_signal_;
  std::vector<std::string> devices_;
  bool devices_known_ = false;
  std::map<int64_t, std::unique_ptr<Worker>> workers_;  // by job id
  std::unique_ptr<DeviceQuery> device_query_;
  bool started_ = false;
  bool stopping_ = false;
  bool shutdown_finished_ = false;  // every worker has ended after Shutdown: no more SIGCHLD waits
  std::function<void()> shutdown_done_;
  std::function<void(bool)> on_change_;
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace trainerd::daemon
