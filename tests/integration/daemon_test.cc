// trainerd and trainctl, the real binaries, end to end: a daemon on a
// temporary socket and state folder running jobs of the tiny Llama fixture on
// the CPU, driven by trainctl (daemon_harness.h).
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/framing.h"
#include "common/proto_framing.h"
#include "proto/trainerd.pb.h"
#include "tests/integration/daemon_harness.h"
#include "tests/temp_dir.h"

namespace trainerd::integration {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// trainctl's exit codes (docs/trainctl.md).
constexpr int kExitJobFailed = 1;
constexpr int kExitNotFound = 5;
constexpr int kExitRejected = 6;

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kTrainerd)) << kTrainerd << " is not built";
    ASSERT_TRUE(fs::exists(kTrainctl)) << kTrainctl << " is not built";
  }

  // A LoRA job of the fixture; `training` is the body of its training: section.
  std::string WriteJob(const std::string& name, const std::string& training, const std::string& output = "") {
    std::string yaml = "model:\n  path: " + kModel + "\nadapter:\n  r: 4\ndata:\n  train: " + kTrain +
                       "\ntraining:\n" + training + "device: cpu\n";
    if (!output.empty()) yaml += "output:\n  dir: " + output + "\n";
    const std::string path = dir_ / name;
    WriteFile(path, yaml);
    return path;
  }

  // Submits and returns the job id.
  int64_t Submit(DaemonProcess& d, const std::string& job, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"submit", job, "--parsable"};
    args.insert(args.end(), extra.begin(), extra.end());
    CtlResult r = d.Ctl(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? std::stoll(r.out) : -1;
  }

  json Status(DaemonProcess& d, int64_t id) {
    CtlResult r = d.Ctl({"status", std::to_string(id), "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? json::parse(r.out) : json::object();
  }

  // Polls status until `done(job)` holds; false after `timeout`.
  template <class Pred>
  bool WaitUntil(DaemonProcess& d, int64_t id, Pred done, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (done(Status(d, id))) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  static int64_t Step(const json& job) { return job.value("progress", json::object()).value("step", int64_t{0}); }

  testing::TempDir dir_;
};

// A long job: far more steps than any test waits for.
constexpr char kEndless[] = "  max_steps: 1000000\n  log_every: 50\n  checkpoint_every: 0\n";
constexpr char kShort[] = "  max_steps: 4\n  log_every: 1\n";

TEST_F(DaemonTest, SubmitRunsToSuccessWithLogsAndOutputs) {
  DaemonProcess d(dir_.path());
  d.Start();
  const int64_t id = Submit(d, WriteJob("short.yaml", kShort));
  ASSERT_GT(id, 0);
  CtlResult wait = d.Ctl({"wait", std::to_string(id)});
  EXPECT_EQ(wait.exit_code, 0) << wait.out << wait.err << d.log();

  json job = Status(d, id);
  EXPECT_EQ(job["state"], "succeeded") << job.dump();
  EXPECT_EQ(job["name"], "short");
  EXPECT_EQ(job["attempt"], 1);
  EXPECT_EQ(Step(job), 4);
  // No output.dir in the spec: the job's own folder.
  const std::string out = d.state_dir() + "/jobs/" + std::to_string(id) + "/output";
  EXPECT_EQ(job["output_dir"], out);
  EXPECT_TRUE(fs::is_regular_file(out + "/adapter/adapter_model.safetensors"));
  EXPECT_EQ(job["result"]["output_path"], out + "/adapter");
  EXPECT_EQ(ReadFile(d.state_dir() + "/jobs/" + std::to_string(id) + "/job.yaml"), ReadFile(dir_ / "short.yaml"));

  CtlResult logs = d.Ctl({"logs", std::to_string(id)});
  EXPECT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_NE(logs.out.find("[trainerd] started on cpu (attempt 1)"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("step 4/4"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("[trainerd] succeeded"), std::string::npos) << logs.out;
  // The daemon's own log names the job on its lines.
  EXPECT_NE(d.log().find("job " + std::to_string(id) + ": started on cpu"), std::string::npos) << d.log();
}

TEST_F(DaemonTest, LogsFollowStreamsUntilTheJobEnds) {
  DaemonProcess d(dir_.path());
  d.Start();
  const int64_t id = Submit(d, WriteJob("job.yaml", "  max_steps: 60\n  log_every: 1\n  micro_batch_size: 2\n"));
  CtlResult follow = d.Ctl({"logs", "-f", std::to_string(id)});
  EXPECT_EQ(follow.exit_code, 0) << follow.err;
  // Every step line, in order, then trainerd's last line.
  size_t at = 0;
  for (int step = 1; step <= 60; ++step) {
    const size_t found = follow.out.find("step " + std::to_string(step) + "/60 ", at);
    ASSERT_NE(found, std::string::npos) << "step " << step << " missing:\n" << follow.out;
    at = found;
  }
  EXPECT_NE(follow.out.find("[trainerd] succeeded", at), std::string::npos) << follow.out;
  EXPECT_EQ(Status(d, id)["state"], "succeeded");
}

TEST_F(DaemonTest, CancelQueuedAndRunningJobs) {
  DaemonProcess d(dir_.path());
  d.Start();
  const int64_t running = Submit(d, WriteJob("a.yaml", kEndless));
  const int64_t queued = Submit(d, WriteJob("b.yaml", kShort));
  ASSERT_TRUE(WaitUntil(d, running, [](const json& j) { return j["state"] == "running" && Step(j) > 0; }))
      << d.log();
  EXPECT_EQ(Status(d, queued)["state"], "queued");  // one device: b waits

  CtlResult c = d.Ctl({"cancel", std::to_string(queued)});
  EXPECT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(Status(d, queued)["state"], "cancelled");

  c = d.Ctl({"cancel", std::to_string(running)});
  EXPECT_EQ(c.exit_code, 0) << c.err;
  CtlResult wait = d.Ctl({"wait", std::to_string(running)});
  EXPECT_EQ(wait.exit_code, kExitJobFailed) << wait.out << wait.err;
  json job = Status(d, running);
  EXPECT_EQ(job["state"], "cancelled") << job.dump();
  EXPECT_NE(job["reason"].get<std::string>().find("cancelled by uid"), std::string::npos) << job.dump();
  // The cancelled queued job never ran.
  EXPECT_EQ(Status(d, queued)["attempt"], 0);

  EXPECT_EQ(d.Ctl({"cancel", "999"}).exit_code, kExitNotFound);
}

TEST_F(DaemonTest, WorkerKilledFailsTheJobAndTheNextOneRuns) {
  DaemonProcess d(dir_.path());
  d.Start();
  const int64_t victim = Submit(d, WriteJob("a.yaml", kEndless));
  const int64_t next = Submit(d, WriteJob("b.yaml", kShort));
  ASSERT_TRUE(WaitUntil(d, victim, [](const json& j) { return Step(j) > 0; })) << d.log();
  const std::vector<pid_t> workers = ChildrenOf(d.pid());
  ASSERT_EQ(workers.size(), 1u);
  ASSERT_EQ(::kill(workers[0], SIGKILL), 0);

  EXPECT_EQ(d.Ctl({"wait", std::to_string(victim)}).exit_code, kExitJobFailed);
  json job = Status(d, victim);
  EXPECT_EQ(job["state"], "failed");
  EXPECT_EQ(job["result"]["signal"], SIGKILL) << job.dump();
  EXPECT_NE(job["reason"].get<std::string>().find("killed by signal 9 (SIGKILL)"), std::string::npos) << job.dump();
  EXPECT_NE(job["reason"].get<std::string>().find("its last lines"), std::string::npos) << job.dump();

  EXPECT_EQ(d.Ctl({"wait", std::to_string(next)}).exit_code, 0) << d.log();
  EXPECT_EQ(Status(d, next)["state"], "succeeded");
}

TEST_F(DaemonTest, SigtermCheckpointsInterruptsAndTheJobResumesAtTheNextStart) {
  DaemonProcess d(dir_.path());
  d.Start();
  const int64_t id = Submit(d, WriteJob("job.yaml", "  max_steps: 600\n  log_every: 10\n"));
  ASSERT_TRUE(WaitUntil(d, id, [](const json& j) { return Step(j) >= 20; })) << d.log();
  d.Signal(SIGTERM);
  const int status = d.Wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << d.log();
  const std::string log = d.log();
  EXPECT_NE(log.find("interrupted"), std::string::npos) << log;
  // The worker wrote a checkpoint before trainerd exited.
  const std::string checkpoints = d.state_dir() + "/jobs/" + std::to_string(id) + "/output/checkpoints";
  ASSERT_TRUE(fs::is_directory(checkpoints)) << log;
  EXPECT_FALSE(fs::is_empty(checkpoints));

  d.Start();
  json job = Status(d, id);
  EXPECT_TRUE(job["state"] == "queued" || job["state"] == "running") << job.dump();
  EXPECT_EQ(d.Ctl({"wait", std::to_string(id)}).exit_code, 0) << d.log();
  job = Status(d, id);
  EXPECT_EQ(job["state"], "succeeded");
  EXPECT_EQ(job["attempt"], 2);
  CtlResult logs = d.Ctl({"logs", std::to_string(id)});
  EXPECT_NE(logs.out.find("resuming after step"), std::string::npos) << logs.out;
}

// kill -9 of trainerd mid-job: its worker checkpoints (SIGTERM on parent
// death), the restarted daemon resumes the job, and the adapter is the one an
// uninterrupted run writes, byte for byte.
TEST_F(DaemonTest, KilledDaemonResumesTheJobToTheUninterruptedAdapter) {
  const std::string training = "  max_steps: 400\n  micro_batch_size: 2\n  log_every: 5\n  checkpoint_every: 0\n";
  DaemonProcess d(dir_.path());
  d.Start();
  const int64_t whole = Submit(d, WriteJob("whole.yaml", training, dir_ / "whole"));
  EXPECT_EQ(d.Ctl({"wait", std::to_string(whole)}).exit_code, 0) << d.log();

  const int64_t id = Submit(d, WriteJob("resumed.yaml", training, dir_ / "resumed"));
  ASSERT_TRUE(WaitUntil(d, id, [](const json& j) { return Step(j) >= 50; })) << d.log();
  ASSERT_LT(Step(Status(d, id)), 400);
  d.Signal(SIGKILL);
  d.Wait();

  d.Start();
  EXPECT_EQ(d.Ctl({"wait", std::to_string(id)}).exit_code, 0) << d.log();
  json job = Status(d, id);
  EXPECT_EQ(job["state"], "succeeded") << job.dump();
  EXPECT_EQ(job["attempt"], 2);
  const std::string a = ReadFile(dir_ / "whole/adapter/adapter_model.safetensors");
  const std::string b = ReadFile(dir_ / "resumed/adapter/adapter_model.safetensors");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the resumed job's adapter differs from the uninterrupted run's";
  CtlResult logs = d.Ctl({"logs", std::to_string(id)});
  EXPECT_NE(logs.out.find("resuming after step"), std::string::npos) << logs.out << d.all_logs();
}

TEST_F(DaemonTest, BadSpecsAreRefusedAtSubmitWithKeyAndLine) {
  DaemonProcess d(dir_.path());
  d.Start();
  struct Case {
    std::string yaml, expect1, expect2;
  };
  const std::string model = "model:\n  path: " + kModel + "\n";
  const std::string data = "data:\n  train: " + kTrain + "\n";
  const std::vector<Case> cases = {
      {model + data + "training:\n  learning_rat: 0.1\n", "spec.yaml:6", "learning_rat"},
      {model + data + "training:\n  max_steps: many\n", "spec.yaml:6", "training.max_steps"},
      {"model:\n  path: " + (dir_ / "nope") + "\n" + data, "model.path", "nope"},
      {model + "data:\n  train: " + (dir_ / "missing.jsonl") + "\n", "data.train", "No such file"},
      {model + data + "training:\n  max_steps: -5\n", "spec.yaml:6", "training.max_steps"},
  };
  for (const Case& c : cases) {
    WriteFile(dir_ / "spec.yaml", c.yaml);
    CtlResult r = d.Ctl({"submit", dir_ / "spec.yaml"});
    EXPECT_EQ(r.exit_code, kExitRejected) << c.yaml << r.out << r.err;
    EXPECT_NE(r.err.find(c.expect1), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.expect2), std::string::npos) << r.err;
  }
  CtlResult list = d.Ctl({"list", "--all", "--json"});
  EXPECT_EQ(json::parse(list.out).size(), 0u) << list.out;
}

TEST_F(DaemonTest, SecondDaemonOnTheSameStateFolderRefusesToStart) {
  DaemonProcess d(dir_.path());
  d.Start();
  const pid_t second = Spawn({kTrainerd, "--socket", dir_ / "other.sock", "--state-dir", d.state_dir(), "--gpus", "cpu"},
                             {}, dir_ / "second");
  const int status = WaitFor(second, std::chrono::seconds(30));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  const std::string err = ReadFile(dir_ / "second.err");
  EXPECT_NE(err.find("another trainerd uses the state folder " + d.state_dir()), std::string::npos) << err;
  EXPECT_EQ(d.Ctl({"list"}).exit_code, 0);  // the first one is unharmed
}

TEST_F(DaemonTest, AWorkerThatCannotRunFailsTheJobSayingWhy) {
  DaemonProcess d(dir_.path(), "worker: " + (dir_ / "no-such-worker") + "\n");
  d.Start();
  const int64_t id = Submit(d, WriteJob("job.yaml", kShort));
  EXPECT_EQ(d.Ctl({"wait", std::to_string(id)}).exit_code, kExitJobFailed);
  json job = Status(d, id);
  EXPECT_EQ(job["state"], "failed");
  EXPECT_EQ(job["result"]["exit_code"], 127);
  EXPECT_NE(job["reason"].get<std::string>().find("cannot run " + (dir_ / "no-such-worker")), std::string::npos)
      << job.dump();
}

// Raw connections: bytes that are not frames close only their own connection.
int Connect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// True when the daemon closed `fd` (EOF) rather than leaving it open.
bool ClosedByPeer(int fd) {
  char c;
  return ::recv(fd, &c, 1, 0) == 0;
}

TEST_F(DaemonTest, BadFramesCloseOnlyTheirConnection) {
  DaemonProcess d(dir_.path());
  d.Start();
  const int good = Connect(d.socket());
  ASSERT_GE(good, 0);

  const int garbage = Connect(d.socket());
  // Garbage length (0xFFFFFFFF > 16 MiB) then junk.
  ASSERT_EQ(::send(garbage, "\xff\xff\xff\xffhello", 9, MSG_NOSIGNAL), 9);
  EXPECT_TRUE(ClosedByPeer(garbage));
  ::close(garbage);

  const int unparsable = Connect(d.socket());
  ASSERT_TRUE(WriteFrame(unparsable, std::string("\xff\xff\xff not a request", 18)).ok());
  EXPECT_TRUE(ClosedByPeer(unparsable));
  ::close(unparsable);

  const int oversized = Connect(d.socket());
  const uint32_t big = kMaxFrameBytes + 1;
  char header[4] = {static_cast<char>(big & 0xff), static_cast<char>((big >> 8) & 0xff),
                    static_cast<char>((big >> 16) & 0xff), static_cast<char>(big >> 24)};
  ASSERT_EQ(::send(oversized, header, 4, MSG_NOSIGNAL), 4);
  EXPECT_TRUE(ClosedByPeer(oversized));
  ::close(oversized);

  const int truncated = Connect(d.socket());
  char half[6] = {100, 0, 0, 0, 1, 2};  // declares 100 bytes, sends 2, then hangs up
  ASSERT_EQ(::send(truncated, half, 6, MSG_NOSIGNAL), 6);
  ::shutdown(truncated, SHUT_WR);
  EXPECT_TRUE(ClosedByPeer(truncated));
  ::close(truncated);

  // The first connection, opened before all that, still gets answers.
  proto::Request request;
  request.mutable_list()->set_all(true);
  ASSERT_TRUE(WriteFrame(good, Serialize(request)).ok());
  StatusOr<std::optional<std::string>> frame = ReadFrame(good);
  ASSERT_TRUE(frame.ok() && frame->has_value()) << (frame.ok() ? "EOF" : frame.status().message());
  proto::Reply reply;
  ASSERT_TRUE(ParseFrame(**frame, &reply).ok());
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_NONE);
  ::close(good);
  EXPECT_EQ(d.Ctl({"list"}).exit_code, 0);
}

TEST_F(DaemonTest, TwoHundredClientsAtOnceAllGetAnswers) {
  DaemonProcess d(dir_.path());
  d.Start();
  Submit(d, WriteJob("job.yaml", kShort));
  constexpr int kClients = 200;
  std::atomic<int> answered{0};
  std::vector<int> fds;
  for (int i = 0; i < kClients; ++i) {
    fds.push_back(Connect(d.socket()));
    ASSERT_GE(fds.back(), 0) << "connection " << i;
  }
  // Every client has connected before any sends: 200 open sessions at once.
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, fd = fds[i], i] {
      proto::Request request;
      if (i % 2) {
        request.mutable_status()->set_job_id(1);
      } else {
        request.mutable_list()->set_all(true);
      }
      if (!WriteFrame(fd, Serialize(request)).ok()) return;
      StatusOr<std::optional<std::string>> frame = ReadFrame(fd);
      proto::Reply reply;
      if (frame.ok() && frame->has_value() && ParseFrame(**frame, &reply).ok() &&
          reply.error().code() == proto::ERROR_CODE_NONE) {
        ++answered;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int fd : fds) ::close(fd);
  EXPECT_EQ(answered.load(), kClients);
}

}  // namespace
}  // namespace trainerd::integration
