#include "daemon/job_service.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/job_proto.h"

namespace trainerd::daemon {
namespace {

namespace fs = std::filesystem;

// A LogsReply carries at most the last this many bytes of a log (a frame holds 16 MiB).
constexpr int64_t kMaxLogReplyBytes = 8 << 20;

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

// Opens `path` for reading as a regular file; "" or why not.
std::string CheckReadableFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::strerror(errno);
  struct stat st {};
  std::string why;
  if (fstat(fd, &st) != 0) {
    why = std::strerror(errno);
  } else if (S_ISDIR(st.st_mode)) {
    why = "it is a folder, not a file";
  } else if (!S_ISREG(st.st_mode)) {
    why = "not a regular file";
  }
  close(fd);
  return why;
}

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

int64_t SystemNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Status CheckSpecFiles(const JobSpec& spec) {
  const std::string& src = spec.source;
  {
    std::error_code ec;
    if (!fs::is_directory(spec.model.path, ec)) {
      std::string why = ec ? ec.message()
                           : (fs::exists(spec.model.path, ec) ? "not a folder" : "no such folder");
      return Status::Error(src + ": model.path: " + spec.model.path + ": " + why +
                           "; point it at a Hugging Face model folder (one with config.json) "
                           "that trainerd can read");
    }
    const std::string config = (fs::path(spec.model.path) / "config.json").string();
    std::string why = CheckReadableFile(config);
    if (!why.empty()) {
      return Status::Error(src + ": model.path: " + config + ": " + why +
                           "; a Hugging Face model folder holds config.json, readable by trainerd");
    }
  }
  for (const auto& [key, path] : {std::pair<const char*, const std::string&>{"data.train", spec.data.train},
                                  std::pair<const char*, const std::string&>{"data.eval", spec.data.eval}}) {
    if (path.empty()) continue;
    std::string why = CheckReadableFile(path);
    if (!why.empty()) {
      return Status::Error(src + ": " + key + ": " + path + ": " + why +
                           "; give a data file that exists and that trainerd can read");
    }
  }
  return Status::Ok();
}

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
                   {"micro_batch_size", spec.training.micro_batch_size},
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

JobService::JobService(JobStore& store, std::string state_dir, Clock now_unix_ms,
                       std::function<void(int64_t)> stop_running)
    : store_(store),
      state_dir_(std::move(state_dir)),
      now_unix_ms_(now_unix_ms ? std::move(now_unix_ms) : Clock(SystemNowMs)),
      stop_running_(std::move(stop_running)) {}

std::string JobService::JobDir(int64_t id) const {
  return (fs::path(state_dir_) / "jobs" / std::to_string(id)).string();
}

void JobService::Handle(const proto::Request& request, const PeerCredentials& peer,
                        ReplyWriter& writer) {
  writer.End(Answer(request, peer));
}

proto::Reply JobService::Answer(const proto::Request& request, const PeerCredentials& peer) {
  switch (request.kind_case()) {
    case proto::Request::kSubmit:
      return Submit(request.submit(), peer);
    case proto::Request::kValidate:
      return Validate(request.validate());
    case proto::Request::kList:
      return List(request.list());
    case proto::Request::kStatus:
      return StatusOf(request.status());
    case proto::Request::kCancel:
      return Cancel(request.cancel(), peer);
    case proto::Request::kLogs:
      return Logs(request.logs());
    case proto::Request::kWait:
      return ErrorReply(proto::ERROR_CODE_INTERNAL, "follow/wait arrive with the supervisor");
    case proto::Request::KIND_NOT_SET:
      break;
  }
  return ErrorReply(proto::ERROR_CODE_BAD_REQUEST,
                    "empty or unknown request; is trainctl newer than this trainerd?");
}

StatusOr<JobSpec> JobService::ParseAndCheck(const proto::JobSpec& spec) const {
  if (spec.base_dir().empty() || spec.base_dir()[0] != '/') {
    return Status::Error("spec base_dir must be an absolute folder, got '" + spec.base_dir() + "'");
  }
  const std::string source = spec.source().empty() ? "job.yaml" : spec.source();
  TRAINERD_ASSIGN_OR_RETURN(JobSpec parsed, ParseJobSpecText(spec.yaml(), source, spec.base_dir()));
  TRAINERD_RETURN_IF_ERROR(CheckSpecFiles(parsed));
  return parsed;
}

proto::Reply JobService::Validate(const proto::ValidateRequest& request) {
  StatusOr<JobSpec> spec = ParseAndCheck(request.spec());
  if (!spec.ok()) return ErrorReply(proto::ERROR_CODE_BAD_REQUEST, spec.status().message());
  proto::Reply reply;
  reply.mutable_validate();
  return reply;
}

proto::Reply JobService::Submit(const proto::SubmitRequest& request, const PeerCredentials& peer) {
  StatusOr<JobSpec> spec = ParseAndCheck(request.spec());
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

  StatusOr<int64_t> id = store_.Add(job);
  if (!id.ok()) return Internal(id.status());

  // The job's folder and job.yaml; on failure the job is cancelled again, so
  // nothing runs a job whose files are missing.
  const std::string dir = JobDir(*id);
  Status written;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    written = Status::Error("creating " + dir + ": " + ec.message());
  } else {
    written = WriteFileAtomically(dir + "/job.yaml", job.spec_yaml);
  }
  if (written.ok()) written = store_.SetPaths(*id, job.output_dir, dir + "/log");
  if (!written.ok()) {
    Status cancelled = store_.Cancel(*id, "trainerd could not set up the job: " + written.message(),
                                     now_unix_ms_());
    std::string message = JobName(*id) + ": " + written.message();
    if (!cancelled.ok()) message += "; and cancelling it failed: " + cancelled.message();
    return ErrorReply(proto::ERROR_CODE_INTERNAL, message);
  }

  proto::Reply reply;
  reply.mutable_submit()->set_job_id(*id);
  return reply;
}

proto::Reply JobService::List(const proto::ListRequest& request) {
  std::vector<JobState> states;
  for (int s : request.states()) {
    if (s < static_cast<int>(JobState::kQueued) || s > static_cast<int>(JobState::kInterrupted)) {
      return ErrorReply(proto::ERROR_CODE_BAD_REQUEST, "unknown job state " + std::to_string(s));
    }
    states.push_back(static_cast<JobState>(s));
  }
  StatusOr<std::vector<JobRecord>> jobs =
      store_.List(request.all(), states, JobStore::ListDetail::kWithoutSpec);
  if (!jobs.ok()) return Internal(jobs.status());
  proto::Reply reply;
  proto::ListReply* list = reply.mutable_list();
  for (const JobRecord& job : *jobs) *list->add_jobs() = JobToProto(job);
  return reply;
}

proto::Reply JobService::StatusOf(const proto::StatusRequest& request) {
  StatusOr<std::optional<JobRecord>> job = store_.Get(request.job_id());
  if (!job.ok()) return Internal(job.status());
  if (!job->has_value()) {
    return ErrorReply(proto::ERROR_CODE_NOT_FOUND, "no " + JobName(request.job_id()));
  }
  proto::Reply reply;
  *reply.mutable_status()->mutable_job() = JobToProto(**job);
  return reply;
}

proto::Reply JobService::Cancel(const proto::CancelRequest& request, const PeerCredentials& peer) {
  // Check every id first: one error fails the request before anything changes.
  std::vector<JobRecord> jobs;
  std::set<int64_t> seen;
  for (int64_t id : request.job_ids()) {
    if (!seen.insert(id).second) continue;
    StatusOr<std::optional<JobRecord>> job = store_.Get(id);
    if (!job.ok()) return Internal(job.status());
    if (!job->has_value()) return ErrorReply(proto::ERROR_CODE_NOT_FOUND, "no " + JobName(id));
    const JobRecord& j = **job;
    if (peer.uid != 0 && peer.uid != j.owner_uid) {
      return ErrorReply(proto::ERROR_CODE_PERMISSION_DENIED,
                        JobName(id) + " belongs to uid " + std::to_string(j.owner_uid) +
                            "; only its owner or root may cancel it");
    }
    if (IsEnded(j.state)) {
      return ErrorReply(proto::ERROR_CODE_BAD_REQUEST,
                        JobName(id) + " already " + JobStateName(j.state));
    }
    if (j.state == JobState::kRunning && !stop_running_) {
      return ErrorReply(proto::ERROR_CODE_INTERNAL,
                        JobName(id) + " is running and this service has no way to stop workers");
    }
    jobs.push_back(j);
  }

  proto::Reply reply;
  proto::CancelReply* cancelled = reply.mutable_cancel();
  const std::string reason = "cancelled by uid " + std::to_string(peer.uid);
  for (const JobRecord& job : jobs) {
    if (job.state == JobState::kRunning) {
      // The supervisor stops the worker and finishes the job as cancelled.
      stop_running_(job.id);
      cancelled->add_cancelled(job.id);
      continue;
    }
    Status status = store_.Cancel(job.id, reason, now_unix_ms_());
    if (!status.ok()) return Internal(status);
    cancelled->add_cancelled(job.id);
  }
  return reply;
}

proto::Reply JobService::Logs(const proto::LogsRequest& request) {
  if (request.follow()) {
    return ErrorReply(proto::ERROR_CODE_INTERNAL, "follow/wait arrive with the supervisor");
  }
  StatusOr<std::optional<JobRecord>> job = store_.Get(request.job_id());
  if (!job.ok()) return Internal(job.status());
  if (!job->has_value()) {
    return ErrorReply(proto::ERROR_CODE_NOT_FOUND, "no " + JobName(request.job_id()));
  }
  const std::string path =
      (*job)->log_path.empty() ? JobDir(request.job_id()) + "/log" : (*job)->log_path;

  proto::Reply reply;
  reply.set_end_of_stream(true);
  proto::LogsReply* logs = reply.mutable_logs();

  if (access(path.c_str(), F_OK) != 0 && errno == ENOENT) return reply;  // nothing logged yet
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return ErrorReply(proto::ERROR_CODE_INTERNAL,
                      "reading " + path + ": " + std::strerror(errno));
  }
  in.seekg(0, std::ios::end);
  const int64_t size = static_cast<int64_t>(in.tellg());
  const int64_t start = size > kMaxLogReplyBytes ? size - kMaxLogReplyBytes : 0;
  in.seekg(start);
  std::string text(static_cast<size_t>(size - start), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  size_t pos = 0;
  if (start > 0) {  // drop the partial first line
    size_t nl = text.find('\n');
    pos = nl == std::string::npos ? text.size() : nl + 1;
  }
  std::vector<std::string_view> lines;
  std::string_view view(text);
  while (pos < view.size()) {
    size_t nl = view.find('\n', pos);
    if (nl == std::string_view::npos) nl = view.size();
    lines.push_back(view.substr(pos, nl - pos));
    pos = nl + 1;
  }
  size_t first = 0;
  if (request.tail() > 0 && lines.size() > static_cast<size_t>(request.tail())) {
    first = lines.size() - static_cast<size_t>(request.tail());
  }
  for (size_t i = first; i < lines.size(); ++i) logs->add_lines()->set_text(std::string(lines[i]));
  return reply;
}

}  // namespace trainerd::daemon
