// JobService over a real JobStore file in a temporary folder. Requests go to
// Answer() directly (any peer uid); one test goes through a real Server on a
// unix socket to check Handle.
#include "daemon/job_service.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/framing.h"
#include "common/proto_framing.h"
#include "daemon/job_proto.h"
#include "daemon/server.h"

namespace trainerd::daemon {
namespace {

// gtest only (no gmock in this project): `text` contains `part`.
#define EXPECT_CONTAINS(text, part)                                  \
  do {                                                               \
    const std::string text_ = (text);                                \
    EXPECT_NE(text_.find(part), std::string::npos)                   \
        << "'" << text_ << "' does not contain '" << (part) << "'"; \
  } while (0)

constexpr uid_t kAna = 1000;
constexpr uid_t kBob = 1001;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

class JobServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/job_service_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(std::system(("mkdir -p " + dir_ + "/models/m " + dir_ + "/data " + dir_ + "/state")
                              .c_str()),
              0);
    WriteAll(dir_ + "/models/m/config.json", "{}\n");
    WriteAll(dir_ + "/data/train.jsonl", "{\"tokens\": [1, 2]}\n");
    auto store = JobStore::Open(dir_ + "/state/jobs.db");
    ASSERT_TRUE(store.ok()) << store.status().message();
    store_ = std::make_unique<JobStore>(std::move(store).value());
    auto registry = JobRegistry::Load(*store_);
    ASSERT_TRUE(registry.ok()) << registry.status().message();
    registry_ = std::move(registry).value();
    JobService::Hooks hooks;
    hooks.job_queued = [this] { ++queued_calls_; };
    hooks.stop_running = [this](int64_t id, const std::string&) {
      stopped_.push_back(id);
      return Status::Ok();
    };
    service_ = std::make_unique<JobService>(*registry_, logs_, dir_ + "/state", [this] { return ++now_; }, hooks);
    registry_->SetStateListener([this](const JobRecord& job) { service_->OnJobChanged(job); });
  }
  void TearDown() override {
    service_.reset();
    registry_.reset();
    store_.reset();
    std::system(("rm -rf " + dir_).c_str());
  }

  std::string Spec(const std::string& extra = "") const {
    return "model:\n"
           "  path: models/m\n"
           "adapter:\n"
           "  r: 16\n"
           "data:\n"
           "  train: data/train.jsonl\n"
           "output:\n"
           "  dir: runs/first\n" +
           extra;
  }

  proto::Request SubmitRequest(const std::string& yaml, const std::string& name = "",
                               int priority = 0) const {
    proto::Request request;
    proto::SubmitRequest* submit = request.mutable_submit();
    submit->mutable_spec()->set_yaml(yaml);
    submit->mutable_spec()->set_source(dir_ + "/llama.yaml");
    submit->mutable_spec()->set_base_dir(dir_);
    submit->set_name(name);
    submit->set_priority(priority);
    return request;
  }

  proto::Reply Ask(const proto::Request& request, uid_t uid = kAna) {
    PeerCredentials peer;
    peer.uid = uid;
    peer.pid = 42;
    return service_->Answer(request, peer);
  }

  int64_t Submit(const std::string& yaml, uid_t uid = kAna) {
    proto::Reply reply = Ask(SubmitRequest(yaml), uid);
    EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_NONE) << reply.error().message();
    return reply.submit().job_id();
  }

  proto::Reply Cancel(std::vector<int64_t> ids, uid_t uid) {
    proto::Request request;
    for (int64_t id : ids) request.mutable_cancel()->add_job_ids(id);
    return Ask(request, uid);
  }

  JobState StateOf(int64_t id) {
    auto job = store_->Get(id);
    EXPECT_TRUE(job.ok() && job->has_value());
    return (*job)->state;
  }

  std::string dir_;
  int64_t now_ = 1000;
  std::vector<int64_t> stopped_;
  int queued_calls_ = 0;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<JobRegistry> registry_;
  JobLogs logs_;
  std::unique_ptr<JobService> service_;
};

TEST_F(JobServiceTest, SubmitAssignsIdsAndStoresTheJob) {
  proto::Reply first = Ask(SubmitRequest(Spec()));
  EXPECT_EQ(first.submit().job_id(), 1);
  EXPECT_EQ(first.submit().name(), "llama");  // the reply names the job as stored
  proto::Reply reply = Ask(SubmitRequest(Spec(), "mine", 5), kBob);
  ASSERT_EQ(reply.error().code(), proto::ERROR_CODE_NONE) << reply.error().message();
  EXPECT_EQ(reply.submit().job_id(), 2);
  EXPECT_EQ(reply.submit().name(), "mine");

  auto job = store_->Get(1);
  ASSERT_TRUE(job.ok() && job->has_value());
  EXPECT_EQ((*job)->name, "llama");  // the spec file's stem
  EXPECT_EQ((*job)->owner_uid, kAna);
  EXPECT_EQ((*job)->spec_yaml, Spec());
  EXPECT_EQ((*job)->spec_source, dir_ + "/llama.yaml");
  EXPECT_EQ((*job)->spec_base_dir, dir_);
  EXPECT_EQ((*job)->output_dir, dir_ + "/runs/first");
  EXPECT_EQ((*job)->log_path, dir_ + "/state/jobs/1/log");
  EXPECT_CONTAINS((*job)->spec_json, "\"path\":\"" + dir_ + "/models/m\"");
  EXPECT_CONTAINS((*job)->spec_json, "\"r\":16");
  EXPECT_CONTAINS((*job)->spec_json, "\"train\":\"" + dir_ + "/data/train.jsonl\"");
  EXPECT_CONTAINS((*job)->spec_json, "\"dir\":\"" + dir_ + "/runs/first\"");

  auto second = store_->Get(2);
  ASSERT_TRUE(second.ok() && second->has_value());
  EXPECT_EQ((*second)->name, "mine");
  EXPECT_EQ((*second)->owner_uid, kBob);
  EXPECT_EQ((*second)->priority, 5);
}

TEST_F(JobServiceTest, SubmitWritesJobYaml) {
  int64_t id = Submit(Spec());
  EXPECT_EQ(service_->JobDir(id), dir_ + "/state/jobs/1");
  EXPECT_EQ(ReadAll(dir_ + "/state/jobs/1/job.yaml"), Spec());
  EXPECT_NE(access((dir_ + "/state/jobs/1/job.yaml.tmp").c_str(), F_OK), 0);
}

TEST_F(JobServiceTest, StatusRoundTrip) {
  int64_t id = Submit(Spec());
  proto::Request request;
  request.mutable_status()->set_job_id(id);
  proto::Reply reply = Ask(request, kBob);  // anyone may look
  ASSERT_EQ(reply.error().code(), proto::ERROR_CODE_NONE) << reply.error().message();
  const proto::Job& job = reply.status().job();
  EXPECT_EQ(job.id(), id);
  EXPECT_EQ(job.state(), proto::JOB_STATE_QUEUED);
  EXPECT_EQ(job.owner_uid(), kAna);
  EXPECT_EQ(job.spec().yaml(), Spec());
  EXPECT_EQ(job.spec().base_dir(), dir_);
  EXPECT_EQ(job.output_dir(), dir_ + "/runs/first");
  EXPECT_EQ(job.submitted_unix_ms(), 1001);

  auto stored = store_->Get(id);
  JobRecord back = JobFromProto(job);
  back.spec_json = (*stored)->spec_json;  // not on the wire
  back.log_path = (*stored)->log_path;
  back.queue_pos = (*stored)->queue_pos;
  EXPECT_TRUE(back == **stored);

  request.mutable_status()->set_job_id(7);
  reply = Ask(request);
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_NOT_FOUND);
  EXPECT_EQ(reply.error().message(), "no job 7");
}

TEST_F(JobServiceTest, BadSpecNamesLineAndKey) {
  proto::Reply reply = Ask(SubmitRequest(Spec("training:\n  learnig_rate: 0.1\n")));
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_BAD_REQUEST);
  EXPECT_CONTAINS(reply.error().message(), "llama.yaml:10:");
  EXPECT_CONTAINS(reply.error().message(), "training.learnig_rate");
  auto jobs = store_->List(true);
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE(jobs->empty());
}

TEST_F(JobServiceTest, NegativeMaxStepsIsBadRequest) {
  proto::Reply reply = Ask(SubmitRequest(Spec("training:\n  max_steps: -3\n")));
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_BAD_REQUEST);
  EXPECT_CONTAINS(reply.error().message(), "training.max_steps");
}

TEST_F(JobServiceTest, MissingModelFolder) {
  std::string yaml = Spec();
  yaml.replace(yaml.find("models/m"), 8, "models/none");
  proto::Reply reply = Ask(SubmitRequest(yaml));
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_BAD_REQUEST);
  EXPECT_CONTAINS(reply.error().message(), "model.path");
  EXPECT_CONTAINS(reply.error().message(), dir_ + "/models/none");
  EXPECT_CONTAINS(reply.error().message(), "config.json");

  // A folder without config.json.
  ASSERT_EQ(std::system(("mkdir -p " + dir_ + "/models/empty").c_str()), 0);
  yaml = Spec();
  yaml.replace(yaml.find("models/m"), 8, "models/empty");
  reply = Ask(SubmitRequest(yaml));
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_BAD_REQUEST);
  EXPECT_CONTAINS(reply.error().message(), dir_ + "/models/empty/config.json");
}

TEST_F(JobServiceTest, UnreadableDataFile) {
  std::string yaml = Spec();
  yaml.replace(yaml.find("data/train.jsonl"), 16, "data/missing.jsonl");
  proto::Reply reply = Ask(SubmitRequest(yaml));
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_BAD_REQUEST);
  EXPECT_CONTAINS(reply.error().message(), "data.train");
  EXPECT_CONTAINS(reply.error().message(), dir_ + "/data/missing.jsonl");

  reply = Ask(SubmitRequest(Spec().replace(Spec().find("output:"), 0, "  eval: data\n")));
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_BAD_REQUEST);
  EXPECT_CONTAINS(reply.error().message(), "data.eval");
  EXPECT_CONTAINS(reply.error().message(), "folder");

  if (geteuid() != 0) {  // root reads anything
    WriteAll(dir_ + "/data/secret.jsonl", "{}\n");
    chmod((dir_ + "/data/secret.jsonl").c_str(), 0);
    yaml = Spec();
    yaml.replace(yaml.find("data/train.jsonl"), 16, "data/secret.jsonl");
    reply = Ask(SubmitRequest(yaml));
    EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_BAD_REQUEST);
    EXPECT_CONTAINS(reply.error().message(), "Permission denied");
  }
}

TEST_F(JobServiceTest, ValidateChecksWithoutStoring) {
  proto::Request request;
  request.mutable_validate()->mutable_spec()->set_yaml(Spec());
  request.mutable_validate()->mutable_spec()->set_source("job.yaml");
  request.mutable_validate()->mutable_spec()->set_base_dir(dir_);
  proto::Reply reply = Ask(request);
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_NONE) << reply.error().message();
  EXPECT_TRUE(reply.has_validate());

  request.mutable_validate()->mutable_spec()->set_yaml(Spec("bogus: 1\n"));
  reply = Ask(request);
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_BAD_REQUEST);
  EXPECT_CONTAINS(reply.error().message(), "job.yaml:9:");
  EXPECT_TRUE(store_->List(true)->empty());
}

TEST_F(JobServiceTest, ListAllVersusActive) {
  Submit(Spec());
  Submit(Spec());
  Submit(Spec());
  ASSERT_TRUE(registry_->Cancel(2, "test", 5).ok());

  proto::Request request;
  request.mutable_list();
  proto::Reply reply = Ask(request, kBob);
  ASSERT_EQ(reply.list().jobs_size(), 2);
  EXPECT_EQ(reply.list().jobs(0).id(), 1);
  EXPECT_EQ(reply.list().jobs(1).id(), 3);
  EXPECT_TRUE(reply.list().jobs(0).spec().yaml().empty());  // kWithoutSpec

  request.mutable_list()->set_all(true);
  reply = Ask(request);
  ASSERT_EQ(reply.list().jobs_size(), 3);
  EXPECT_EQ(reply.list().jobs(1).state(), proto::JOB_STATE_CANCELLED);

  request.mutable_list()->set_all(false);
  request.mutable_list()->add_states(proto::JOB_STATE_CANCELLED);
  reply = Ask(request);
  ASSERT_EQ(reply.list().jobs_size(), 1);
  EXPECT_EQ(reply.list().jobs(0).id(), 2);
}

TEST_F(JobServiceTest, ListCarriesTheReasonsFirstLineAndStatusAllOfIt) {
  const int64_t id = Submit(Spec());
  ASSERT_TRUE(registry_->MarkRunning(id, "cpu", 10).ok());
  const std::string first_line = "the worker exited with status 1 \xE2\x82\xAC; its last lines:";
  const std::string reason = first_line + "\n  error: boom\n  more";
  ASSERT_TRUE(registry_->Finish(id, JobState::kFailed, JobResult{1, 0, "", 0}, reason, 20).ok());
  proto::Request list;
  list.mutable_list()->set_all(true);
  proto::Reply listed = Ask(list);
  ASSERT_EQ(listed.list().jobs_size(), 1);
  EXPECT_EQ(listed.list().jobs(0).reason(), first_line + "...");
  proto::Request status;
  status.mutable_status()->set_job_id(id);
  EXPECT_EQ(Ask(status).status().job().reason(), reason);

  // A long first line is cut at 200 bytes, never inside a character.
  const int64_t other = Submit(Spec());
  std::string long_reason;
  for (int i = 0; i < 100; ++i) long_reason += "\xE2\x82\xAC";
  ASSERT_TRUE(registry_->Cancel(other, long_reason, 30).ok());
  listed = Ask(list);
  ASSERT_EQ(listed.list().jobs_size(), 2);
  const std::string cut = listed.list().jobs(1).reason();
  EXPECT_EQ(cut.size(), 66u * 3 + 3);  // 66 whole euro signs (198 bytes), then "..."
  EXPECT_EQ(cut.substr(cut.size() - 3), "...");
}

TEST_F(JobServiceTest, CancelQueuedByOwner) {
  int64_t id = Submit(Spec());
  proto::Reply reply = Cancel({id}, kAna);
  ASSERT_EQ(reply.error().code(), proto::ERROR_CODE_NONE) << reply.error().message();
  ASSERT_EQ(reply.cancel().cancelled_size(), 1);
  EXPECT_EQ(reply.cancel().cancelled(0), id);
  auto job = store_->Get(id);
  EXPECT_EQ((*job)->state, JobState::kCancelled);
  EXPECT_EQ((*job)->reason, "cancelled by uid 1000");
}

TEST_F(JobServiceTest, CancelByAnotherUidChangesNothing) {
  int64_t mine = Submit(Spec(), kBob);
  int64_t hers = Submit(Spec(), kAna);
  proto::Reply reply = Cancel({mine, hers}, kBob);
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_PERMISSION_DENIED);
  EXPECT_EQ(reply.error().message(),
            "job 2 belongs to uid 1000; only its owner or root may cancel it");
  EXPECT_EQ(StateOf(mine), JobState::kQueued);
  EXPECT_EQ(StateOf(hers), JobState::kQueued);
}

TEST_F(JobServiceTest, CancelByRoot) {
  int64_t id = Submit(Spec(), kAna);
  proto::Reply reply = Cancel({id}, 0);
  ASSERT_EQ(reply.error().code(), proto::ERROR_CODE_NONE) << reply.error().message();
  EXPECT_EQ(StateOf(id), JobState::kCancelled);
  EXPECT_EQ(store_->Get(id)->value().reason, "cancelled by uid 0");
}

TEST_F(JobServiceTest, CancelUnknownIdIsNotFoundAndChangesNothing) {
  int64_t id = Submit(Spec());
  proto::Reply reply = Cancel({id, 7}, kAna);
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_NOT_FOUND);
  EXPECT_EQ(reply.error().message(), "no job 7");
  EXPECT_EQ(StateOf(id), JobState::kQueued);
}

TEST_F(JobServiceTest, CancelEndedIsBadRequest) {
  int64_t id = Submit(Spec());
  ASSERT_TRUE(registry_->MarkRunning(id, "cpu", 10).ok());
  ASSERT_TRUE(registry_->Finish(id, JobState::kSucceeded, {}, "", 20).ok());
  proto::Reply reply = Cancel({id}, kAna);
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_BAD_REQUEST);
  EXPECT_EQ(reply.error().message(), "job 1 already succeeded");
}

TEST_F(JobServiceTest, CancelRunningAsksTheSupervisor) {
  int64_t running = Submit(Spec());
  int64_t queued = Submit(Spec());
  ASSERT_TRUE(registry_->MarkRunning(running, "cpu", 10).ok());
  proto::Reply reply = Cancel({running, queued}, kAna);
  ASSERT_EQ(reply.error().code(), proto::ERROR_CODE_NONE) << reply.error().message();
  ASSERT_EQ(reply.cancel().cancelled_size(), 2);
  EXPECT_EQ(stopped_, std::vector<int64_t>{running});
  EXPECT_EQ(StateOf(running), JobState::kRunning);  // the supervisor finishes it
  EXPECT_EQ(StateOf(queued), JobState::kCancelled);

  // Without a way to stop workers, cancelling a running job is an error, not a silent no-op.
  JobService bare(*registry_, logs_, dir_ + "/state");
  PeerCredentials peer;
  peer.uid = kAna;
  proto::Request request;
  request.mutable_cancel()->add_job_ids(running);
  reply = bare.Answer(request, peer);
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_INTERNAL);
  EXPECT_NE(reply.error().message().find("is running"), std::string::npos) << reply.error().message();
}

TEST_F(JobServiceTest, LogsTail) {
  int64_t id = Submit(Spec());
  proto::Request request;
  request.mutable_logs()->set_job_id(id);
  proto::Reply reply = Ask(request);
  ASSERT_EQ(reply.error().code(), proto::ERROR_CODE_NONE) << reply.error().message();
  EXPECT_TRUE(reply.end_of_stream());
  EXPECT_EQ(reply.logs().lines_size(), 0);  // no log yet

  WriteAll(dir_ + "/state/jobs/1/log", "one\ntwo\nthree\nfour\n");
  reply = Ask(request);
  ASSERT_EQ(reply.logs().lines_size(), 4);
  EXPECT_EQ(reply.logs().lines(0).text(), "one");

  request.mutable_logs()->set_tail(2);
  reply = Ask(request);
  ASSERT_EQ(reply.logs().lines_size(), 2);
  EXPECT_EQ(reply.logs().lines(0).text(), "three");
  EXPECT_EQ(reply.logs().lines(1).text(), "four");
  EXPECT_TRUE(reply.end_of_stream());

  request.mutable_logs()->set_job_id(9);
  EXPECT_EQ(Ask(request).error().code(), proto::ERROR_CODE_NOT_FOUND);

  // Streamed answers go through Handle (FollowAndWaitOverTheSocket), not Answer.
  request.mutable_logs()->set_job_id(id);
  request.mutable_logs()->set_follow(true);
  EXPECT_EQ(Ask(request).error().code(), proto::ERROR_CODE_BAD_REQUEST);
}

// The service behind a real Server on a unix socket, its io_context on a
// thread of its own; `post` runs code on that thread (as the supervisor would).
class ServedOverSocket {
 public:
  ServedOverSocket(RequestHandler& handler, const std::string& path)
      : work_(boost::asio::make_work_guard(io_)), server_(io_, handler), path_(path) {
    std::promise<Status> listened;
    boost::asio::post(io_, [&] { listened.set_value(server_.Listen(path_, 0600)); });
    thread_ = std::thread([this] { io_.run(); });
    listen_status_ = listened.get_future().get();
  }
  ~ServedOverSocket() {
    Run([this] { server_.Stop(); });
    work_.reset();
    io_.stop();
    thread_.join();
  }
  const Status& listen_status() const { return listen_status_; }

  // Runs `f` on the io thread and waits for it.
  void Run(std::function<void()> f) {
    std::promise<void> done;
    boost::asio::post(io_, [&] {
      f();
      done.set_value();
    });
    done.get_future().wait();
  }

  // A new connection that has sent `request`.
  int Send(const proto::Request& request) const {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    EXPECT_TRUE(WriteFrame(fd, Serialize(request)).ok());
    return fd;
  }

  // The next Reply on `fd` (an empty one, with a failure recorded, if none).
  static proto::Reply NextReply(int fd) {
    proto::Reply reply;
    auto frame = ReadFrame(fd);
    EXPECT_TRUE(frame.ok() && frame->has_value());
    if (frame.ok() && frame->has_value()) {
      EXPECT_TRUE(ParseFrame(**frame, &reply).ok());
    }
    return reply;
  }

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  Server server_;
  std::string path_;
  std::thread thread_;
  Status listen_status_;
};

// Handle, through a real Server on a unix socket: the peer is this process.
TEST_F(JobServiceTest, HandleAnswersOverTheSocket) {
  ServedOverSocket served(*service_, dir_ + "/run/trainerd.sock");
  ASSERT_TRUE(served.listen_status().ok()) << served.listen_status().message();
  const int fd = served.Send(SubmitRequest(Spec()));
  proto::Reply reply = ServedOverSocket::NextReply(fd);
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_NONE) << reply.error().message();
  EXPECT_EQ(reply.submit().job_id(), 1);
  close(fd);
  EXPECT_EQ(store_->Get(1)->value().owner_uid, getuid());
  EXPECT_EQ(queued_calls_, 1);  // the supervisor is told to schedule
}

// logs --follow and wait through a real Server: the follower gets the tail,
// then each appended line; both streams end when the job ends.
TEST_F(JobServiceTest, FollowAndWaitOverTheSocket) {
  const int64_t id = Submit(Spec());
  ASSERT_TRUE(registry_->MarkRunning(id, "cpu", 10).ok());
  ASSERT_TRUE(logs_.Open(id, dir_ + "/state/jobs/1/log").ok());
  ASSERT_TRUE(logs_.Append(id, "before").ok());
  ServedOverSocket served(*service_, dir_ + "/run/trainerd.sock");
  ASSERT_TRUE(served.listen_status().ok()) << served.listen_status().message();

  proto::Request follow;
  follow.mutable_logs()->set_job_id(id);
  follow.mutable_logs()->set_follow(true);
  const int follower = served.Send(follow);
  proto::Request wait;
  wait.mutable_wait()->set_job_id(id);
  const int waiter = served.Send(wait);

  proto::Reply tail = ServedOverSocket::NextReply(follower);
  ASSERT_EQ(tail.logs().lines_size(), 1);
  EXPECT_EQ(tail.logs().lines(0).text(), "before");
  EXPECT_FALSE(tail.end_of_stream());

  // Appending and finishing happen on the io thread, as the supervisor does them.
  served.Run([&] {
    EXPECT_TRUE(logs_.Append(id, "live line").ok());
    EXPECT_TRUE(registry_->Finish(id, JobState::kFailed, JobResult{1, 0, "", 0}, "it broke", 99).ok());
  });
  proto::Reply live = ServedOverSocket::NextReply(follower);
  ASSERT_EQ(live.logs().lines_size(), 1);
  EXPECT_EQ(live.logs().lines(0).text(), "live line");
  EXPECT_GT(live.logs().lines(0).unix_ms(), 0);
  EXPECT_TRUE(ServedOverSocket::NextReply(follower).end_of_stream());

  proto::Reply waited = ServedOverSocket::NextReply(waiter);
  EXPECT_TRUE(waited.end_of_stream());
  EXPECT_EQ(waited.wait().job().state(), proto::JOB_STATE_FAILED);
  EXPECT_EQ(waited.wait().job().reason(), "it broke");
  close(follower);
  close(waiter);

  // Waiting for a job that has already ended answers at once.
  const int late = served.Send(wait);
  EXPECT_EQ(ServedOverSocket::NextReply(late).wait().job().state(), proto::JOB_STATE_FAILED);
  close(late);
}

// Over the socket a list is assembled from cached bytes (Handle); it must say
// exactly what Answer's Reply says, before and after jobs end.
TEST_F(JobServiceTest, ListOverTheSocketEqualsTheAnsweredReply) {
  const int64_t done = Submit(Spec());
  const int64_t running = Submit(Spec());
  Submit(Spec());  // queued
  ASSERT_TRUE(registry_->MarkRunning(done, "cpu", 10).ok());
  ASSERT_TRUE(registry_->Finish(done, JobState::kFailed, JobResult{1, 0, "", 0}, "first\nsecond", 20).ok());
  ASSERT_TRUE(registry_->MarkRunning(running, "cpu", 30).ok());
  ServedOverSocket served(*service_, dir_ + "/run/trainerd.sock");
  ASSERT_TRUE(served.listen_status().ok());
  auto compare = [&](const proto::Request& request) {
    const int fd = served.Send(request);
    const proto::Reply over_socket = ServedOverSocket::NextReply(fd);
    close(fd);
    proto::Reply answered;
    served.Run([&] { answered = Ask(request); });
    EXPECT_EQ(over_socket.SerializeAsString(), answered.SerializeAsString())
        << over_socket.DebugString() << "\nvs\n" << answered.DebugString();
    return over_socket;
  };
  proto::Request all;
  all.mutable_list()->set_all(true);
  EXPECT_EQ(compare(all).list().jobs_size(), 3);
  EXPECT_EQ(compare(all).list().jobs(0).reason(), "first...");  // served from the cache the second time
  // A running job's progress changes between lists; an ended job's cached bytes stay right.
  served.Run([&] {
    JobProgress p;
    p.step = 7;
    EXPECT_TRUE(registry_->UpdateProgress(running, p).ok());
    EXPECT_TRUE(registry_->Finish(running, JobState::kSucceeded, JobResult{0, 0, "/o/adapter", 0}, "", 40).ok());
  });
  EXPECT_EQ(compare(all).list().jobs(1).progress().step(), 7);
  proto::Request active;
  active.mutable_list();
  EXPECT_EQ(compare(active).list().jobs_size(), 1);
  proto::Request paged = all;
  paged.mutable_list()->set_limit(1);
  EXPECT_EQ(compare(paged).list().next_after_id(), 1);
  proto::Request bad;
  bad.mutable_list()->add_states(static_cast<proto::JobState>(42));
  EXPECT_EQ(compare(bad).error().code(), proto::ERROR_CODE_BAD_REQUEST);
}

TEST_F(JobServiceTest, ListPagesFollowNextAfterId) {
  for (int i = 0; i < 5; ++i) Submit(Spec());
  ASSERT_TRUE(registry_->Cancel(2, "gone", 9).ok());
  proto::Request request;
  request.mutable_list()->set_all(true);
  request.mutable_list()->set_limit(2);
  std::vector<int64_t> seen;
  std::vector<int64_t> next_ids;
  for (int pages = 0; pages < 10; ++pages) {
    proto::Reply reply = Ask(request);
    ASSERT_EQ(reply.error().code(), proto::ERROR_CODE_NONE) << reply.error().message();
    EXPECT_LE(reply.list().jobs_size(), 2);
    for (const proto::Job& job : reply.list().jobs()) seen.push_back(job.id());
    next_ids.push_back(reply.list().next_after_id());
    if (reply.list().next_after_id() == 0) break;
    request.mutable_list()->set_after_id(reply.list().next_after_id());
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(next_ids, (std::vector<int64_t>{2, 4, 0}));
  // Without --all: the cancelled job 2 is skipped, pages still cover the rest.
  request.mutable_list()->set_all(false);
  request.mutable_list()->set_after_id(0);
  proto::Reply first = Ask(request);
  ASSERT_EQ(first.list().jobs_size(), 2);
  EXPECT_EQ(first.list().jobs(0).id(), 1);
  EXPECT_EQ(first.list().jobs(1).id(), 3);
  EXPECT_EQ(first.list().next_after_id(), 3);
  request.mutable_list()->set_limit(-1);
  EXPECT_EQ(Ask(request).error().code(), proto::ERROR_CODE_BAD_REQUEST);
}

}  // namespace
}  // namespace trainerd::daemon
