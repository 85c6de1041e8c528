#include "daemon/job_service.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/spec_check.h"
#include "common/utf8_text.h"
#include "daemon/job_proto.h"

namespace trainerd::daemon {
namespace {

namespace fs = std::filesystem;

proto::Reply ErrorReply(proto::ErrorCode code, const std::string& message) {
  proto::Reply reply;
  reply.mutable_error()->set_code(code);
  reply.mutable_error()->set_message(message);
  return reply;
}

proto::Reply Internal(const Status& status) {
  return ErrorReply(proto::ERROR_CODE_INTERNAL, status.message());
}

std::string JobName(int64_t id) { return "job " + std::to_string(id); }

// Writes `path` atomically: a temporary file in the same folder, fsync, rename, fsync the folder.
Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  auto fail = [&](const std::string& what) {
    return Status::Error("writing " + path + ": " + what + ": " + std::strerror(errno));
  };
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail("open " + tmp);
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = fail("write");
      close(fd);
      unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    Status s = fail("fsync");
    close(fd);
    unlink(tmp.c_str());
    return s;
  }
  if (close(fd) != 0) {
    Status s = fail("close");
    unlink(tmp.c_str());
    return s;
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = fail("rename");
    unlink(tmp.c_str());
    return s;
  }
  const std::string dir = fs::path(path).parent_path().string();
  int dfd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return Status::Ok();
}

// The longest reason a ListReply's job carries (then "..."): see List.
constexpr size_t kListReasonBytes = 200;
// The most jobs one ListReply holds (~300 bytes each: far below the 16 MiB frame limit).
constexpr size_t kListPageJobs = 10000;

int64_t SystemNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string SpecToJson(const JobSpec& spec) {
  nlohmann::ordered_json j;
  j["task"] = spec.task;
  j["model"] = {{"path", spec.model.path}, {"dtype", spec.model.dtype}};
  if (spec.adapter) {
    const AdapterSpec& a = *spec.adapter;
    j["adapter"] = {{"type", a.type},
                    {"r", a.r},
                    {"alpha", a.alpha},
                    {"dropout", a.dropout},
                    {"target_modules", a.target_modules},
                    {"use_rslora", a.use_rslora},
                    {"init", a.init}};
  }
  j["data"] = {{"train", spec.data.train},
               {"eval", spec.data.eval},
               {"format", spec.data.format},
               {"chat_template", spec.data.chat_template},
               {"max_seq_len", spec.data.max_seq_len},
               {"packing", spec.data.packing}};
  j["training"] = {{"epochs", spec.training.epochs},
                   {"max_steps", spec.training.max_steps},
                   {"micro_batch_size", spec.training.micro_batch_size_auto
                                            ? nlohmann::ordered_json("auto")
                                            : nlohmann::ordered_json(spec.training.micro_batch_size)},
                   {"gradient_checkpointing", spec.training.gradient_checkpointing},
                   {"gradient_checkpointing_layers", spec.training.gradient_checkpointing_layers},
                   {"gradient_accumulation_steps", spec.training.gradient_accumulation_steps},
                   {"learning_rate", spec.training.learning_rate},
                   {"lr_scheduler", spec.training.lr_scheduler},
                   {"warmup_steps", spec.training.warmup_steps},
                   {"seed", spec.training.seed}};
  j["output"] = {{"dir", spec.output.dir}, {"merge", spec.output.merge}};
  j["device"] = spec.device;
  // Paths need not be UTF-8: replace invalid bytes rather than throw.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

JobService::JobService(JobRegistry& jobs, JobLogs& logs, std::string state_dir, Clock now_unix_ms, Hooks hooks)
    : jobs_(jobs),
      logs_(logs),
      state_dir_(std::move(state_dir)),
      now_unix_ms_(now_unix_ms ? std::move(now_unix_ms) : Clock(SystemNowMs)),
      hooks_(std::move(hooks)) {}

std::string JobService::JobDir(int64_t id) const {
  return (fs::path(state_dir_) / "jobs" / std::to_string(id)).string();
}

void JobService::Handle(const proto::Request& request, const PeerCredentials& peer, ReplyWriter& writer) {
  if (request.kind_case() == proto::Request::kLogs && request.logs().follow()) {
    FollowLogs(request.logs(), writer);
    return;
  }
  if (request.kind_case() == proto::Request::kWait) {
    Wait(request.wait(), writer);
    return;
  }
  if (request.kind_case() == proto::Request::kList) {
    writer.EndSerialized(SerializedList(request.list()));
    return;
  }
  writer.End(Answer(request, peer));
}

proto::Reply JobService::Answer(const proto::Request& request, const PeerCredentials& peer) {
  switch (request.kind_case()) {
    case proto::Request::kSubmit:
      return Submit(request.submit(), peer);
    case proto::Request::kValidate:
      return Validate(request.validate());
    case proto::Request::kList: {
      proto::Reply reply;
      List(request.list(), &reply);
      return reply;
    }
    case proto::Request::kStatus:
      return StatusOf(request.status());
    case proto::Request::kCancel:
      return Cancel(request.cancel(), peer);
    case proto::Request::kLogs:
      if (request.logs().follow()) {
        return ErrorReply(proto::ERROR_CODE_BAD_REQUEST, "logs --follow is a streamed answer (Handle)");
      }
      return Logs(request.logs());
    case proto::Request::kWait:
      return ErrorReply(proto::ERROR_CODE_BAD_REQUEST, "wait is a streamed answer (Handle)");
    case proto::Request::KIND_NOT_SET:
      break;
  }
  return ErrorReply(proto::ERROR_CODE_BAD_REQUEST, "empty or unknown request; is trainctl newer than this trainerd?");
}

proto::Reply JobService::Validate(const proto::ValidateRequest& request) {
  StatusOr<JobSpec> spec =
      ValidateSubmittedSpec(request.spec().yaml(), request.spec().source(), request.spec().base_dir());
  if (!spec.ok()) return ErrorReply(proto::ERROR_CODE_BAD_REQUEST, spec.status().message());
  proto::Reply reply;
  reply.mutable_validate();
  return reply;
}

proto::Reply JobService::Submit(const proto::SubmitRequest& request, const PeerCredentials& peer) {
  StatusOr<JobSpec> spec =
      ValidateSubmittedSpec(request.spec().yaml(), request.spec().source(), request.spec().base_dir());
  if (!spec.ok()) return ErrorReply(proto::ERROR_CODE_BAD_REQUEST, spec.status().message());

  JobRecord job;
  job.name = request.name();
  if (job.name.empty()) job.name = fs::path(request.spec().source()).stem().string();
  if (job.name.empty()) job.name = "job";
  job.owner_uid = peer.uid;
  job.priority = request.priority();
  job.submitted_unix_ms = now_unix_ms_();
  job.spec_yaml = request.spec().yaml();
  job.spec_source = request.spec().source();
  job.spec_base_dir = request.spec().base_dir();
  job.spec_json = SpecToJson(*spec);
  job.output_dir = spec->output.dir;

  StatusOr<int64_t> id = jobs_.Add(job);
  if (!id.ok()) return Internal(id.status());

  // The job's folder and job.yaml; on failure the job is cancelled again, so
  // nothing runs a job whose files are missing.
  const std::string dir = JobDir(*id);
  const std::string output_dir = job.output_dir.empty() ? dir + "/output" : job.output_dir;
  Status written;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    written = Status::Error("creating " + dir + ": " + ec.message());
  } else {
    written = WriteFileAtomically(dir + "/job.yaml", job.spec_yaml);
  }
  if (written.ok()) written = jobs_.SetPaths(*id, output_dir, dir + "/log");
  if (!written.ok()) {
    Status cancelled =
        jobs_.Cancel(*id, "trainerd could not set up the job: " + written.message(), now_unix_ms_());
    std::string message = JobName(*id) + ": " + written.message();
    if (!cancelled.ok()) message += "; and cancelling it failed: " + cancelled.message();
    return ErrorReply(proto::ERROR_CODE_INTERNAL, message);
  }
  if (hooks_.job_queued) hooks_.job_queued();

  proto::Reply reply;
  reply.mutable_submit()->set_job_id(*id);
  reply.mutable_submit()->set_name(job.name);
  return reply;
}

StatusOr<JobService::ListPage> JobService::Listed(const proto::ListRequest& request) const {
  std::vector<JobState> states;
  for (int s : request.states()) {
    if (s < static_cast<int>(JobState::kQueued) || s > static_cast<int>(JobState::kInterrupted)) {
      return Status::Error("unknown job state " + std::to_string(s));
    }
    states.push_back(static_cast<JobState>(s));
  }
  if (request.limit() < 0) return Status::Error("list limit must be 0 or more, got " + std::to_string(request.limit()));
  const size_t limit = request.limit() == 0 ? kListPageJobs : std::min<size_t>(request.limit(), kListPageJobs);
  ListPage page;
  for (const JobRecord* job : jobs_.Select(request.all(), states)) {
    if (job->id <= request.after_id()) continue;
    if (page.jobs.size() == limit) {
      page.next_after_id = page.jobs.back()->id;
      break;
    }
    page.jobs.push_back(job);
  }
  return page;
}

void JobService::ListedJob(const JobRecord& job, proto::Job* out) {
  JobToProto(job, out);
  out->clear_spec();  // status shows it
  // A table shows the reason's first line; status has all of it (a failed
  // job's reason carries its worker's last lines, much of a list's bytes).
  const std::string_view reason = job.reason;
  const std::string_view shown = Utf8Prefix(reason.substr(0, reason.find('\n')), kListReasonBytes);
  if (shown.size() < reason.size()) out->set_reason(std::string(shown) + "...");
}

void JobService::List(const proto::ListRequest& request, proto::Reply* reply) {
  StatusOr<ListPage> page = Listed(request);
  if (!page.ok()) {
    *reply = ErrorReply(proto::ERROR_CODE_BAD_REQUEST, page.status().message());
    return;
  }
  proto::ListReply* list = reply->mutable_list();
  for (const JobRecord* job : page->jobs) ListedJob(*job, list->add_jobs());
  list->set_next_after_id(page->next_after_id);
}

namespace {

// Protobuf's wire format, for a reply assembled from serialized pieces.
void AppendVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// A length-delimited field (wire type 2): a submessage's bytes.
void AppendLengthDelimited(std::string* out, int field_number, const std::string& bytes) {
  AppendVarint(out, (static_cast<uint64_t>(field_number) << 3) | 2);
  AppendVarint(out, bytes.size());
  out->append(bytes);
}

}  // namespace

std::string JobService::SerializedList(const proto::ListRequest& request) {
  StatusOr<ListPage> page = Listed(request);
  if (!page.ok()) return ErrorReply(proto::ERROR_CODE_BAD_REQUEST, page.status().message()).SerializeAsString();
  std::string list;  // a ListReply: one `jobs` entry per job, then next_after_id
  proto::Job job_proto;
  for (const JobRecord* job : page->jobs) {
    if (IsEnded(job->state)) {  // an ended job never changes: serialized once
      auto cached = ended_job_bytes_.find(job->id);
      if (cached == ended_job_bytes_.end()) {
        job_proto.Clear();
        ListedJob(*job, &job_proto);
        cached = ended_job_bytes_.emplace(job->id, job_proto.SerializeAsString()).first;
      }
      AppendLengthDelimited(&list, proto::ListReply::kJobsFieldNumber, cached->second);
    } else {
      job_proto.Clear();
      ListedJob(*job, &job_proto);
      AppendLengthDelimited(&list, proto::ListReply::kJobsFieldNumber, job_proto.SerializeAsString());
    }
  }
  if (page->next_after_id != 0) {
    AppendVarint(&list, (static_cast<uint64_t>(proto::ListReply::kNextAfterIdFieldNumber) << 3) | 0);  // varint
    AppendVarint(&list, static_cast<uint64_t>(page->next_after_id));
  }
  std::string reply;  // a Reply with only `list` set
  AppendLengthDelimited(&reply, proto::Reply::kListFieldNumber, list);
  return reply;
}

proto::Reply JobService::StatusOf(const proto::StatusRequest& request) {
  if (jobs_.Find(request.job_id()) == nullptr) {
    return ErrorReply(proto::ERROR_CODE_NOT_FOUND, "no " + JobName(request.job_id()));
  }
  // With the spec as submitted: one primary-key read of the store.
  StatusOr<JobRecord> job = jobs_.ReadFull(request.job_id());
  if (!job.ok()) return Internal(job.status());
  proto::Reply reply;
  *reply.mutable_status()->mutable_job() = JobToProto(*job);
  return reply;
}

proto::Reply JobService::Cancel(const proto::CancelRequest& request, const PeerCredentials& peer) {
  // Check every id first: one error fails the request before anything changes.
  std::vector<JobRecord> jobs;
  std::set<int64_t> seen;
  for (int64_t id : request.job_ids()) {
    if (!seen.insert(id).second) continue;
    const JobRecord* job = jobs_.Find(id);
    if (job == nullptr) return ErrorReply(proto::ERROR_CODE_NOT_FOUND, "no " + JobName(id));
    if (peer.uid != 0 && peer.uid != job->owner_uid) {
      return ErrorReply(proto::ERROR_CODE_PERMISSION_DENIED,
                        JobName(id) + " belongs to uid " + std::to_string(job->owner_uid) +
                            "; only its owner or root may cancel it");
    }
    if (IsEnded(job->state)) {
      return ErrorReply(proto::ERROR_CODE_BAD_REQUEST, JobName(id) + " already " + JobStateName(job->state));
    }
    if (job->state == JobState::kRunning && !hooks_.stop_running) {
      return ErrorReply(proto::ERROR_CODE_INTERNAL,
                        JobName(id) + " is running and this service has no way to stop workers");
    }
    jobs.push_back(*job);
  }

  proto::Reply reply;
  proto::CancelReply* cancelled = reply.mutable_cancel();
  const std::string reason = "cancelled by uid " + std::to_string(peer.uid);
  for (const JobRecord& job : jobs) {
    Status status = job.state == JobState::kRunning ? hooks_.stop_running(job.id, reason)
                                                    : jobs_.Cancel(job.id, reason, now_unix_ms_());
    if (!status.ok()) return Internal(status);
    cancelled->add_cancelled(job.id);
  }
  return reply;
}

proto::Reply JobService::Logs(const proto::LogsRequest& request) {
  const JobRecord* job = jobs_.Find(request.job_id());
  if (job == nullptr) return ErrorReply(proto::ERROR_CODE_NOT_FOUND, "no " + JobName(request.job_id()));
  const std::string path = job->log_path.empty() ? JobDir(job->id) + "/log" : job->log_path;
  StatusOr<std::vector<std::string>> lines = ReadLogTail(path, request.tail());
  if (!lines.ok()) return Internal(lines.status());
  proto::Reply reply;
  reply.set_end_of_stream(true);
  proto::LogsReply* logs = reply.mutable_logs();
  for (const std::string& line : *lines) logs->add_lines()->set_text(ValidUtf8(line));
  return reply;
}

void JobService::FollowLogs(const proto::LogsRequest& request, ReplyWriter& writer) {
  proto::Reply tail = Logs(request);
  if (tail.error().code() != proto::ERROR_CODE_NONE || IsEnded(jobs_.Find(request.job_id())->state)) {
    writer.End(tail);  // an error, or the whole log of an ended job
    return;
  }
  tail.set_end_of_stream(false);
  writer.Send(tail);
  logs_.Follow(request.job_id(), writer);
}

void JobService::Wait(const proto::WaitRequest& request, ReplyWriter& writer) {
  const JobRecord* job = jobs_.Find(request.job_id());
  if (job == nullptr) {
    writer.End(ErrorReply(proto::ERROR_CODE_NOT_FOUND, "no " + JobName(request.job_id())));
    return;
  }
  if (IsEnded(job->state)) {
    proto::Reply reply;
    reply.set_end_of_stream(true);
    *reply.mutable_wait()->mutable_job() = JobToProto(*job);
    writer.End(reply);
    return;
  }
  const int64_t id = job->id;
  std::list<ReplyWriter>& list = waiters_[id];
  auto it = list.insert(list.end(), writer);
  it->OnClose([this, id, it] {
    auto waiters = waiters_.find(id);
    if (waiters == waiters_.end()) return;
    waiters->second.erase(it);
    if (waiters->second.empty()) waiters_.erase(waiters);
  });
}

void JobService::OnJobChanged(const JobRecord& job) {
  if (!IsEnded(job.state)) return;
  logs_.Close(job.id);  // ends log followers (a queued job cancelled has no worker to do it)
  auto waiters = waiters_.find(job.id);
  if (waiters == waiters_.end()) return;
  std::list<ReplyWriter> ending = std::move(waiters->second);
  waiters_.erase(waiters);
  proto::Reply reply;
  reply.set_end_of_stream(true);
  *reply.mutable_wait()->mutable_job() = JobToProto(job);
  for (ReplyWriter& writer : ending) writer.End(reply);
}

}  // namespace trainerd::daemon
