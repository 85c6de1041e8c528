// The daemon's jobs: the JobStore on disk and a copy of every job in memory.
//
// trainctl's list and status are answered from memory (no SQLite read per
// request); every change goes to the store first, in one transaction, and
// reaches the copy only once it is committed, so memory never shows a state
// the disk does not have. The one exception is progress: a running job
// reports every few steps, and writing each report durably would fsync that
// often, so progress is kept in memory at once and written to the store at
// most every kProgressWriteInterval, and always before the job's next state
// change. After a crash a job's stored progress is at most that old.
//
// The copy holds every field but the spec's text (spec_yaml, spec_json),
// which list and status do not show; Spec() reads it from the store.
//
// Threading: not thread-safe; the daemon's io_context thread makes every call.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "common/status.h"
#include "daemon/job_store.h"

namespace trainerd::daemon {

class JobRegistry {
 public:
  static constexpr std::chrono::seconds kProgressWriteInterval{5};

  // Called after a job's state changed (submitted, started, ended, interrupted),
  // with the job as it is now.
  using StateListener = std::function<void(const JobRecord&)>;

  // Reads every job from `store`, which must outlive the registry.
  static StatusOr<std::unique_ptr<JobRegistry>> Load(JobStore& store);

  void SetStateListener(StateListener listener) { listener_ = std::move(listener); }

  // The job, or nullptr. The pointer is valid until the next change to that job.
  const JobRecord* Find(int64_t id) const;
  // Jobs ordered by id, selected as JobStore::List selects them.
  std::vector<const JobRecord*> Select(bool include_ended, const std::vector<JobState>& states) const;
  // The queued job to run next (highest priority, then FIFO), or nullptr.
  const JobRecord* NextQueued() const;
  // How many jobs are in `state`.
  size_t Count(JobState state) const;
  size_t size() const { return jobs_.size(); }

  // The job's spec text and parsed JSON, read from the store.
  StatusOr<JobRecord> ReadFull(int64_t id);

  // JobStore's changes, mirrored. The state listener runs after each but SetPaths.
  StatusOr<int64_t> Add(const JobRecord& job);
  Status SetPaths(int64_t id, const std::string& output_dir, const std::string& log_path);
  Status MarkRunning(int64_t id, const std::string& device, int64_t started_unix_ms);
  Status Finish(int64_t id, JobState state, const JobResult& result, const std::string& reason,
                int64_t finished_unix_ms);
  Status Cancel(int64_t id, const std::string& reason, int64_t now_unix_ms);
  // In memory at once; in the store when kProgressWriteInterval has passed
  // since the job's last write (or at its next state change).
  Status UpdateProgress(int64_t id, const JobProgress& progress);

 private:
  explicit JobRegistry(JobStore& store) : store_(store) {}
  // Re-reads job `id` from the store into the copy and tells the listener.
  Status Refresh(int64_t id, bool notify);
  // Writes a job's progress held only in memory.
  Status FlushProgress(int64_t id);

  JobStore& store_;
  std::map<int64_t, JobRecord> jobs_;
  // Jobs whose in-memory progress is newer than the store's, and when each was last written.
  std::map<int64_t, std::chrono::steady_clock::time_point> progress_written_;
  std::map<int64_t, bool> progress_dirty_;
  StateListener listener_;
};

}  // namespace trainerd::daemon
