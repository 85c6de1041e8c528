#include "daemon/job_registry.h"

#include <algorithm>
#include <utility>

namespace trainerd::daemon {
namespace {

void DropSpecText(JobRecord* job) {
  job->spec_yaml.clear();
  job->spec_yaml.shrink_to_fit();
  job->spec_json.clear();
  job->spec_json.shrink_to_fit();
}

bool Selected(const JobRecord& job, bool include_ended, const std::vector<JobState>& states) {
  if (!states.empty()) return std::find(states.begin(), states.end(), job.state) != states.end();
  return include_ended || !IsEnded(job.state);
}

}  // namespace

StatusOr<std::unique_ptr<JobRegistry>> JobRegistry::Load(JobStore& store) {
  std::unique_ptr<JobRegistry> registry(new JobRegistry(store));
  TRAINERD_ASSIGN_OR_RETURN(std::vector<JobRecord> jobs,
                            store.List(/*include_ended=*/true, {}, JobStore::ListDetail::kWithoutSpec));
  for (JobRecord& job : jobs) {
    const int64_t id = job.id;
    registry->jobs_.emplace_hint(registry->jobs_.end(), id, std::move(job));
  }
  return registry;
}

const JobRecord* JobRegistry::Find(int64_t id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::vector<const JobRecord*> JobRegistry::Select(bool include_ended, const std::vector<JobState>& states) const {
  std::vector<const JobRecord*> out;
  for (const auto& [id, job] : jobs_) {
    if (Selected(job, include_ended, states)) out.push_back(&job);
  }
  return out;
}

const JobRecord* JobRegistry::NextQueued() const {
  const JobRecord* best = nullptr;
  for (const auto& [id, job] : jobs_) {
    if (job.state != JobState::kQueued) continue;
    if (best == nullptr || job.priority > best->priority ||
        (job.priority == best->priority && job.queue_pos < best->queue_pos)) {
      best = &job;
    }
  }
  return best;
}

size_t JobRegistry::Count(JobState state) const {
  size_t n = 0;
  for (const auto& [id, job] : jobs_) n += job.state == state;
  return n;
}

StatusOr<JobRecord> JobRegistry::ReadFull(int64_t id) {
  TRAINERD_ASSIGN_OR_RETURN(std::optional<JobRecord> job, store_.Get(id));
  if (!job) return Status::Error("no job " + std::to_string(id));
  auto it = jobs_.find(id);
  if (it != jobs_.end()) job->progress = it->second.progress;  // memory may be newer
  return std::move(*job);
}

Status JobRegistry::Refresh(int64_t id, bool notify) {
  TRAINERD_ASSIGN_OR_RETURN(std::optional<JobRecord> job, store_.Get(id));
  if (!job) return Status::Error("job " + std::to_string(id) + " vanished from the job store");
  DropSpecText(&*job);
  JobRecord& held = jobs_[id];
  held = std::move(*job);
  if (notify && listener_) listener_(held);
  return Status::Ok();
}

Status JobRegistry::FlushProgress(int64_t id) {
  auto dirty = progress_dirty_.find(id);
  if (dirty == progress_dirty_.end() || !dirty->second) return Status::Ok();
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return Status::Ok();
  TRAINERD_RETURN_IF_ERROR(store_.UpdateProgress(id, it->second.progress));
  dirty->second = false;
  progress_written_[id] = std::chrono::steady_clock::now();
  return Status::Ok();
}

StatusOr<int64_t> JobRegistry::Add(const JobRecord& job) {
  TRAINERD_ASSIGN_OR_RETURN(int64_t id, store_.Add(job));
  TRAINERD_RETURN_IF_ERROR(Refresh(id, /*notify=*/true));
  return id;
}

Status JobRegistry::SetPaths(int64_t id, const std::string& output_dir, const std::string& log_path) {
  TRAINERD_RETURN_IF_ERROR(store_.SetPaths(id, output_dir, log_path));
  return Refresh(id, /*notify=*/false);
}

Status JobRegistry::MarkRunning(int64_t id, const std::string& device, int64_t started_unix_ms) {
  TRAINERD_RETURN_IF_ERROR(store_.MarkRunning(id, device, started_unix_ms));
  progress_written_[id] = std::chrono::steady_clock::now();
  return Refresh(id, /*notify=*/true);
}

Status JobRegistry::Finish(int64_t id, JobState state, const JobResult& result, const std::string& reason,
                           int64_t finished_unix_ms) {
  TRAINERD_RETURN_IF_ERROR(FlushProgress(id));
  TRAINERD_RETURN_IF_ERROR(store_.Finish(id, state, result, reason, finished_unix_ms));
  progress_dirty_.erase(id);
  progress_written_.erase(id);
  return Refresh(id, /*notify=*/true);
}

Status JobRegistry::Cancel(int64_t id, const std::string& reason, int64_t now_unix_ms) {
  TRAINERD_RETURN_IF_ERROR(store_.Cancel(id, reason, now_unix_ms));
  return Refresh(id, /*notify=*/true);
}

Status JobRegistry::UpdateProgress(int64_t id, const JobProgress& progress) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return Status::Error("no job " + std::to_string(id));
  if (it->second.state != JobState::kRunning) {
    return Status::Error("job " + std::to_string(id) + " is " + JobStateName(it->second.state) +
                         ", not running: its progress is not updated");
  }
  it->second.progress = progress;
  progress_dirty_[id] = true;
  const auto now = std::chrono::steady_clock::now();
  auto written = progress_written_.find(id);
  if (written == progress_written_.end() || now - written->second >= kProgressWriteInterval) {
    return FlushProgress(id);
  }
  return Status::Ok();
}

}  // namespace trainerd::daemon
