// The persistent job queue: one SQLite file in trainerd's state directory.
//
// The store works with plain structs (no protobuf); the server converts them
// to and from proto/trainerd.proto's Job. It owns every job's row: what was
// submitted, where the job is in its life, its latest progress and its result.
//
// On disk: WAL journal, synchronous=FULL (a committed change survives a power
// loss), a `schema_version` table and migrations applied in order when a file
// from an older trainerd is opened. A file from a newer trainerd is refused.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace trainerd::daemon {

// Mirrors proto JobState: the same numbers, so the server may static_cast.
// The file stores the lower-case names ("queued", ...), readable in sqlite3.
enum class JobState {
  kQueued = 1,       // waiting for a device
  kRunning = 2,      // a worker process runs it
  kSucceeded = 3,    // outputs written
  kFailed = 4,       // the worker failed or crashed; reason and result say why
  kCancelled = 5,    // by its owner or root
  kInterrupted = 6,  // stopped by trainerd's shutdown after a checkpoint
};

// "queued", "running", "succeeded", "failed", "cancelled", "interrupted".
const char* JobStateName(JobState state);
std::optional<JobState> ParseJobState(std::string_view name);
// Succeeded, failed and cancelled jobs have ended; the others may still run.
bool IsEnded(JobState state);

// The latest progress a running job reported (proto Progress).
struct JobProgress {
  int64_t step = 0;
  int64_t total_steps = 0;
  double epoch = 0;
  double loss = 0;
  double learning_rate = 0;
  double grad_norm = 0;
  double tokens_per_second = 0;  // non-padding tokens
  double mfu = 0;                // model FLOPs utilisation, 0 when unknown
  int64_t peak_memory_bytes = 0; // GPU, 0 on the CPU
  double elapsed_seconds = 0;
  double eta_seconds = 0;
  double eval_loss = 0;          // the latest evaluation, 0 when none yet
  // Every double round-trips, NaN and ±inf included (a diverged run's loss).

  bool operator==(const JobProgress&) const;
};

// How the last attempt ended (proto JobResult).
struct JobResult {
  int32_t exit_code = 0;    // the worker's exit status, when it exited
  int32_t signal = 0;       // the signal that killed it, 0 when none
  std::string output_path;  // the adapter / model folder
  double eval_loss = 0;

  bool operator==(const JobResult&) const;
};

struct JobRecord {
  int64_t id = 0;  // assigned by Add, from 1, never reused
  std::string name;
  uint32_t owner_uid = 0;
  JobState state = JobState::kQueued;
  int32_t priority = 0;            // higher runs first; FIFO within a priority
  int64_t submitted_unix_ms = 0;
  int64_t started_unix_ms = 0;     // of the current or last attempt; 0 when never started
  int64_t finished_unix_ms = 0;    // 0 until it ended (or was interrupted)
  int32_t attempt = 0;             // 0 while never run; 1 for the first run, +1 per resume
  std::string spec_yaml;           // the YAML text as submitted
  std::string spec_source;         // file name for messages, e.g. "/home/ana/llama.yaml"
  std::string spec_base_dir;       // absolute; relative paths in the spec resolve here
  std::string spec_json;           // the validated spec as JSON; opaque to the store
  std::string output_dir;
  std::string log_path;
  std::string device;              // of the current or last attempt ("cuda:0", "cpu"); "" before the first
  JobProgress progress;
  JobResult result;
  std::string reason;              // why it failed, was cancelled or interrupted
  // Order among queued jobs of one priority, ascending. Assigned by Add (above
  // every existing position) and by RecoverAfterRestart (below all of them);
  // may be negative. Meaningful only relative to other jobs' positions.
  int64_t queue_pos = 0;

  bool operator==(const JobRecord&) const;
};

// The queue in one SQLite file. Owns its connection (sqlite3*); move-only.
//
// NOT thread-safe: one thread owns a JobStore and makes every call (the
// daemon's io_context thread, or a thread it hands blocking writes to, never
// both at once). Each call is one SQLite transaction (RecoverAfterRestart too),
// so a crash leaves every job either before or after a call, never between.
// Errors read "job store <path>: <operation>: <what went wrong>".
//
// State changes accepted (anything else is an error naming the job's state):
//   Add → queued;  queued → running (MarkRunning);
//   running → succeeded | failed | cancelled | interrupted (Finish);
//   queued | interrupted → cancelled (Cancel);
//   running | interrupted → queued at the head (RecoverAfterRestart, at startup).
class JobStore {
 public:
  // The schema this build writes. Older files are migrated up to it.
  static constexpr int kSchemaVersion = 2;

  // Opens `path`, creating it (and its parent folders) if absent, and brings
  // its schema up to kSchemaVersion in one transaction. Refuses a file that is
  // not SQLite, a SQLite file that is not a job store, and a newer schema.
  static StatusOr<JobStore> Open(const std::string& path);

  JobStore(JobStore&&) noexcept;
  JobStore& operator=(JobStore&&) noexcept;
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;
  ~JobStore();  // closes the file; a moved-from store only closes nothing

  const std::string& path() const;

  // Stores a new queued job and returns its id. Stored from `job`: name,
  // owner_uid, priority, submitted_unix_ms, spec_*, output_dir, log_path. The
  // rest is assigned: id, queue_pos (after every job so far), state queued,
  // attempt 0, times, device, progress, result and reason empty.
  StatusOr<int64_t> Add(const JobRecord& job);

  // The job, or nullopt when there is no job `id`.
  StatusOr<std::optional<JobRecord>> Get(int64_t id);

  // How much of each job List reads: everything, or all but spec_yaml and
  // spec_json (left empty), which are most of a row's bytes and which a job
  // table does not show.
  enum class ListDetail { kFull, kWithoutSpec };

  // Jobs ordered by id. A non-empty `states` selects exactly the jobs in those
  // states; otherwise include_ended=false keeps queued, running and
  // interrupted jobs, and include_ended=true keeps every job.
  StatusOr<std::vector<JobRecord>> List(bool include_ended, const std::vector<JobState>& states = {},
                                        ListDetail detail = ListDetail::kFull);

  // The queued job to run next: the highest priority, then the lowest
  // queue_pos (FIFO). nullopt when nothing is queued.
  StatusOr<std::optional<JobRecord>> NextQueued();

  // queued → running on `device`: attempt + 1, started_unix_ms set; finished
  // time, result and reason cleared. Progress is kept (a resumed job's last
  // figures stay visible until its worker reports).
  Status MarkRunning(int64_t id, const std::string& device, int64_t started_unix_ms);

  // Replaces a running job's progress.
  Status UpdateProgress(int64_t id, const JobProgress& progress);

  // running → `state` (succeeded, failed, cancelled or interrupted), with the
  // worker's result, the reason and the time.
  Status Finish(int64_t id, JobState state, const JobResult& result, const std::string& reason,
                int64_t finished_unix_ms);

  // queued or interrupted → cancelled. A running job is cancelled by stopping
  // its worker and then calling Finish(id, kCancelled, ...).
  Status Cancel(int64_t id, const std::string& reason, int64_t now_unix_ms);

  // Sets where a job's outputs and log go (the server knows them only once
  // Add has assigned the id). Any state.
  Status SetPaths(int64_t id, const std::string& output_dir, const std::string& log_path);

  // Called once at startup, before any worker runs: jobs left running (trainerd
  // was killed or lost power) or interrupted (stopped by its shutdown) become
  // queued at the head of the queue, i.e. below every other job's queue_pos,
  // in their previous queue order; reason notes that they resume from their
  // last checkpoint. Priority still comes first (NextQueued). Returns their
  // ids in their new queue order. Nothing else changes.
  StatusOr<std::vector<int64_t>> RecoverAfterRestart();

  // The value of `PRAGMA <name>` on this connection as text (e.g.
  // "journal_mode" → "wal", "synchronous" → "2"), for diagnostics and tests.
  // `name` must be a bare identifier. Prepared per call: not for hot paths.
  StatusOr<std::string> PragmaValue(const std::string& name);

 private:
  struct Impl;
  explicit JobStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainerd::daemon
