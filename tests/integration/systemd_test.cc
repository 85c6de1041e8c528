// trainerd's systemd integration with systemd's own mechanisms, no mocks: the
// real trainerd binary gets a $NOTIFY_SOCKET datagram socket (sd_notify's
// READY/STATUS/WATCHDOG/RELOADING/STOPPING/EXTEND_TIMEOUT_USEC), a listening
// socket as fd 3 with $LISTEN_FDS/$LISTEN_PID (trainerd.socket's activation),
// SIGHUP (ExecReload=) and SIGTERM (systemctl stop), as systemd gives them; the
// test plays systemd's side and trainctl is the client (daemon_harness.h).
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/integration/daemon_harness.h"
#include "tests/temp_dir.h"

namespace trainerd::integration {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

// One sd_notify(3) datagram: NAME=value lines ("READY=1", "RELOADING=1\nMONOTONIC_USEC=...").
struct NotifyMessage {
  std::string text;
  pid_t sender = 0;  // from SCM_CREDENTIALS, what systemd's NotifyAccess=main checks
  Clock::time_point received;

  // The value of the NAME= line; nullopt when there is none.
  std::optional<std::string> Field(const std::string& name) const {
    size_t at = 0;
    while (at <= text.size()) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(at, end - at);
      if (line.compare(0, name.size() + 1, name + "=") == 0) return line.substr(name.size() + 1);
      at = end + 1;
    }
    return std::nullopt;
  }
};

// systemd's end of $NOTIFY_SOCKET: an AF_UNIX datagram socket at `path` with
// SO_PASSCRED, so each message comes with its sender's pid. A thread reads it
// all the time, as systemd does: sd_notify blocks the sender once the socket
// holds net.unix.max_dgram_qlen unread messages (10 here; systemd raises it to
// 512), and trainerd has one thread. Next returns the first matching message
// after the last one it returned; every message is kept for the transcript.
class NotifySocket {
 public:
  explicit NotifySocket(std::string path) : path_(std::move(path)) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path_.c_str());
    const int on = 1;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::setsockopt(fd_, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) != 0 || ::pipe2(stop_, O_CLOEXEC) != 0) {
      error_ = std::strerror(errno);
      return;
    }
    reader_ = std::thread([this] { ReadUntilStopped(); });
  }
  ~NotifySocket() {
    if (reader_.joinable()) {
      (void)!::write(stop_[1], "x", 1);
      reader_.join();
    }
    for (int fd : {fd_, stop_[0], stop_[1]}) {
      if (fd >= 0) ::close(fd);
    }
  }
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;

  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }  // empty when the socket is bound

  // The first message after the last one Next returned with a NAME= line
  // whose value contains `part`; nullopt if none comes before `deadline`.
  std::optional<NotifyMessage> Next(const std::string& name, const std::string& part, Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      for (; cursor_ < messages_.size(); ++cursor_) {
        const std::optional<std::string> value = messages_[cursor_].Field(name);
        if (value && value->find(part) != std::string::npos) return messages_[cursor_++];
      }
      if (arrived_.wait_until(lock, deadline) == std::cv_status::timeout && cursor_ == messages_.size()) {
        return std::nullopt;
      }
    }
  }
  std::optional<NotifyMessage> Next(const std::string& name, const std::string& part = "",
                                    milliseconds timeout = seconds(10)) {
    return Next(name, part, Clock::now() + timeout);
  }

  // Every message received so far.
  std::vector<NotifyMessage> messages() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return messages_;
  }

  // The messages received so far, one a line, for failure messages.
  std::string Transcript() const {
    std::string out = "messages on $NOTIFY_SOCKET:\n";
    for (const NotifyMessage& m : messages()) {
      std::string text = m.text;
      for (char& c : text) c = c == '\n' ? '|' : c;
      out += "  [pid " + std::to_string(m.sender) + "] " + text + "\n";
    }
    return out;
  }

 private:
  // The reader thread: every datagram into messages_ until the stop pipe is written.
  void ReadUntilStopped() {
    while (true) {
      pollfd p[2] = {{fd_, POLLIN, 0}, {stop_[0], POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (p[1].revents != 0) return;
      char buffer[4096];
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
      iovec iov{buffer, sizeof(buffer)};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      const ssize_t n = ::recvmsg(fd_, &msg, MSG_DONTWAIT);
      if (n < 0) continue;  // EAGAIN, EINTR
      NotifyMessage m;
      m.text.assign(buffer, static_cast<size_t>(n));
      while (!m.text.empty() && m.text.back() == '\n') m.text.pop_back();
      m.received = Clock::now();
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
          ucred cred;
          std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
          m.sender = cred.pid;
        }
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        messages_.push_back(std::move(m));
      }
      arrived_.notify_all();
    }
  }

  std::string path_;
  int fd_ = -1;
  int stop_[2] = {-1, -1};  // the destructor writes to stop_[1] to end the reader
  std::string error_;
  std::thread reader_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::vector<NotifyMessage> messages_;  // guarded by mutex_
  size_t cursor_ = 0;                    // guarded by mutex_
};

// A file descriptor closed with its owner: -1 for none.
class OwnedFd {
 public:
  explicit OwnedFd(int fd) : fd_(fd) {}
  ~OwnedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  OwnedFd(OwnedFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  OwnedFd& operator=(OwnedFd&&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// A unix socket bound at `path` (type SOCK_STREAM and listening, as systemd
// makes trainerd.socket's ListenStream=, or another kind); -1 on error.
OwnedFd BoundSocket(const std::string& path, int type = SOCK_STREAM, bool listening = true) {
  OwnedFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (fd.get() < 0 || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      (listening && ::listen(fd.get(), SOMAXCONN) != 0)) {
    return OwnedFd(-1);
  }
  return fd;
}

// The identity of the file at `path`; st_ino 0 when there is none.
struct stat FileIdentity(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) st.st_ino = 0;
  return st;
}

uint64_t MonotonicUsec() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000u + static_cast<uint64_t>(ts.tv_nsec) / 1000u;
}

// READY=1 from `d`'s trainerd; nullopt after 10 s, or as soon as trainerd has exited.
std::optional<NotifyMessage> WaitForReady(NotifySocket& notify, const DaemonProcess& d) {
  const auto deadline = Clock::now() + seconds(10);
  while (Clock::now() < deadline) {
    if (auto ready = notify.Next("READY", "1", std::min(deadline, Clock::now() + milliseconds(50)))) return ready;
    siginfo_t info{};  // WNOWAIT: DaemonProcess::Wait still reaps it
    if (::waitid(P_PID, static_cast<id_t>(d.pid()), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == d.pid()) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

bool Exited(int status, int code) { return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == code; }

class SystemdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    ASSERT_TRUE(fs::exists(kTrainerd)) << kTrainerd << " is not built";
    ASSERT_TRUE(fs::exists(kTrainctl)) << kTrainctl << " is not built";
  }

  // A LoRA job of the tiny fixture model on the CPU that runs far longer than
  // any test waits (progress every step).
  std::string WriteEndlessJob() {
    const std::string path = dir_ / "endless.yaml";
    WriteFile(path, "model:\n  path: " + kModel + "\nadapter:\n  r: 4\ndata:\n  train: " + kTrain +
                        "\ntraining:\n  max_steps: 1000000\n  log_every: 1\n  checkpoint_every: 0\ndevice: cpu\n");
    return path;
  }

  // trainctl status JOB --json; an empty object when that fails.
  static json JobStatus(const DaemonProcess& d, int64_t id) {
    CtlResult r = d.Ctl({"status", std::to_string(id), "--json"});
    return r.exit_code == 0 ? json::parse(r.out, nullptr, /*allow_exceptions=*/false) : json::object();
  }

  // Polls until job `id` has done a training step; false after `timeout`.
  static bool WaitForFirstStep(const DaemonProcess& d, int64_t id, seconds timeout = seconds(60)) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      const json job = JobStatus(d, id);
      if (job.is_object() && job.value("progress", json::object()).value("step", int64_t{0}) > 0) return true;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }

  // Runs trainerd ARGS (no daemon expected to stay up) and waits for it to exit.
  struct Run {
    int status = -1;
    std::string err;
  };
  Run RunTrainerd(const std::vector<std::string>& args, const SpawnOptions& options = {}) {
    std::vector<std::string> argv{kTrainerd};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string stem = dir_ / ("trainerd-run-" + std::to_string(++runs_));
    Run run;
    run.status = WaitFor(SpawnWith(argv, options, stem), seconds(10));
    run.err = ReadFile(stem + ".err");
    return run;
  }

  testing::TempDir dir_;
  int runs_ = 0;
};

// Type=notify, WatchdogSec= and systemctl reload/stop, as trainerd.service
// runs it: every sd_notify message in its order, each sent by trainerd itself.
TEST_F(SystemdTest, NotifiesReadyStatusWatchdogReloadingAndStopping) {
  NotifySocket notify(dir_ / "notify");
  ASSERT_EQ(notify.error(), "");
  DaemonOptions options;
  options.spawn.env = {"NOTIFY_SOCKET=" + notify.path(), "WATCHDOG_USEC=200000"};
  options.spawn.pid_env = {"WATCHDOG_PID"};  // sd_watchdog_enabled() checks it is trainerd's own pid
  DaemonProcess d(dir_.path(), "", options);
  d.Launch();

  // READY=1 once the socket accepts connections: a client right after it gets in.
  const std::optional<NotifyMessage> ready = WaitForReady(notify, d);
  ASSERT_TRUE(ready) << notify.Transcript() << d.log();
  EXPECT_TRUE(CanConnect(d.socket())) << "READY=1 came before the socket accepted connections";
  EXPECT_EQ(ready->sender, d.pid());
  EXPECT_TRUE(notify.Next("STATUS", ", 0 queued")) << notify.Transcript();

  // WATCHDOG_USEC=200000: a ping every 100 ms, so at least two within a second of READY.
  const auto second_after_ready = ready->received + seconds(1);
  EXPECT_TRUE(notify.Next("WATCHDOG", "1", second_after_ready)) << notify.Transcript();
  EXPECT_TRUE(notify.Next("WATCHDOG", "1", second_after_ready)) << notify.Transcript();

  // systemctl reload: RELOADING=1 stamped with CLOCK_MONOTONIC now (Type=notify-reload wants it), then READY=1.
  const uint64_t sighup_usec = MonotonicUsec();
  d.Signal(SIGHUP);
  const std::optional<NotifyMessage> reloading = notify.Next("RELOADING", "1");
  ASSERT_TRUE(reloading) << notify.Transcript() << d.log();
  const std::optional<std::string> monotonic = reloading->Field("MONOTONIC_USEC");
  ASSERT_TRUE(monotonic) << "RELOADING=1 without MONOTONIC_USEC: " << reloading->text;
  const uint64_t reload_usec = std::stoull(*monotonic);
  EXPECT_GE(reload_usec, sighup_usec);
  EXPECT_LE(reload_usec, MonotonicUsec());
  EXPECT_TRUE(notify.Next("READY", "1")) << "no READY=1 after the reload\n" << notify.Transcript() << d.log();

  // A running job shows in `systemctl status`.
  CtlResult submit = d.Ctl({"submit", WriteEndlessJob(), "--parsable"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  ASSERT_EQ(submit.out, "1\n");
  EXPECT_TRUE(notify.Next("STATUS", "job 1")) << notify.Transcript() << d.log();
  ASSERT_TRUE(WaitForFirstStep(d, 1)) << d.log();

  // systemctl stop with a worker training: STOPPING=1, then more time while it checkpoints, then exit 0.
  d.Signal(SIGTERM);
  EXPECT_TRUE(notify.Next("STOPPING", "1")) << notify.Transcript() << d.log();
  const std::optional<NotifyMessage> extend = notify.Next("EXTEND_TIMEOUT_USEC", "");
  ASSERT_TRUE(extend) << notify.Transcript() << d.log();
  EXPECT_GT(std::stoull(*extend->Field("EXTEND_TIMEOUT_USEC")), 0u) << extend->text;
  const pid_t trainerd = d.pid();
  const int exit_status = d.Wait();
  EXPECT_TRUE(Exited(exit_status, 0)) << exit_status << "\n" << d.log();
  EXPECT_NE(d.log().find("job 1: interrupted"), std::string::npos) << d.log();
  EXPECT_FALSE(fs::is_empty(d.state_dir() + "/jobs/1/output/checkpoints")) << d.log();

  // NotifyAccess=main: systemd would drop anything the workers sent.
  for (const NotifyMessage& m : notify.messages()) {
    EXPECT_EQ(m.sender, trainerd) << "a message not from trainerd: " << m.text;
  }
}

// trainerd.socket: systemd binds and listens, trainerd gets the socket as fd 3.
TEST_F(SystemdTest, SocketActivationServesOnThePassedSocketAndLeavesItsFileToSystemd) {
  NotifySocket notify(dir_ / "notify");
  ASSERT_EQ(notify.error(), "");
  const std::string sock = dir_ / "sock";
  const OwnedFd listener = BoundSocket(sock);
  ASSERT_GE(listener.get(), 0) << std::strerror(errno);
  const struct stat bound = FileIdentity(sock);
  DaemonOptions options;
  options.spawn.env = {"LISTEN_FDS=1", "LISTEN_FDNAMES=trainerd.socket", "NOTIFY_SOCKET=" + notify.path()};
  options.spawn.pid_env = {"LISTEN_PID"};
  options.spawn.fds = {listener.get()};
  DaemonProcess activated(dir_.path(), "", options);
  ASSERT_EQ(activated.socket(), sock);  // --socket names it too: trainerd must not bind it itself

  activated.Launch();
  ASSERT_TRUE(WaitForReady(notify, activated)) << notify.Transcript() << activated.log();
  EXPECT_NE(activated.log().find("listening on the socket systemd passed"), std::string::npos) << activated.log();
  CtlResult list = activated.Ctl({"--socket", activated.socket(), "list"}, seconds(10));
  EXPECT_EQ(list.exit_code, 0) << list.err << activated.log();

  activated.Signal(SIGTERM);
  EXPECT_TRUE(Exited(activated.Wait(seconds(10)), 0)) << activated.log();
  // The socket file is systemd's: trainerd neither replaced nor removed it.
  const struct stat after = FileIdentity(activated.socket());
  EXPECT_TRUE(after.st_ino == bound.st_ino && after.st_dev == bound.st_dev && S_ISSOCK(after.st_mode))
      << "trainerd replaced or removed the socket systemd owns";
  EXPECT_FALSE(fs::exists(sock + ".lock")) << "trainerd ran its own Listen on systemd's socket path";

  // And it still listens in systemd's hands: a client that connects while
  // trainerd is down waits in the backlog and is served by the next activation.
  const std::string stem = dir_ / "trainctl-while-down";
  const pid_t early = Spawn({kTrainctl, "--socket", activated.socket(), "list", "--json"}, {}, stem);
  activated.Launch();
  ASSERT_TRUE(WaitForReady(notify, activated)) << notify.Transcript() << activated.log();
  EXPECT_TRUE(Exited(WaitFor(early, seconds(10)), 0)) << ReadFile(stem + ".err") << activated.log();
  EXPECT_EQ(ReadFile(stem + ".out"), "[]\n");
  activated.Signal(SIGTERM);
  EXPECT_TRUE(Exited(activated.Wait(seconds(10)), 0)) << activated.log();
  EXPECT_EQ(FileIdentity(activated.socket()).st_ino, bound.st_ino);
}

TEST_F(SystemdTest, SocketActivationWithTwoSocketsRefusesToStart) {
  const OwnedFd a = BoundSocket(dir_ / "a.sock");
  const OwnedFd b = BoundSocket(dir_ / "b.sock");
  ASSERT_TRUE(a.get() >= 0 && b.get() >= 0) << std::strerror(errno);
  SpawnOptions options;
  options.env = {"LISTEN_FDS=2", "LISTEN_FDNAMES=a:b"};
  options.pid_env = {"LISTEN_PID"};
  options.fds = {a.get(), b.get()};
  const Run run = RunTrainerd({"--socket", dir_ / "sock", "--state-dir", dir_ / "state"}, options);
  EXPECT_TRUE(Exited(run.status, 1)) << run.status << "\n" << run.err;
  EXPECT_NE(run.err.find("cannot start: systemd passed 2 sockets; trainerd.socket must have exactly one ListenStream="),
            std::string::npos)
      << run.err;
  EXPECT_FALSE(fs::exists(dir_ / "sock")) << "trainerd listened on its own socket instead";
  EXPECT_TRUE(fs::exists(dir_ / "a.sock") && fs::exists(dir_ / "b.sock"));
}

// ListenDatagram= by mistake: the passed socket is not a listening stream socket.
TEST_F(SystemdTest, SocketActivationWithADatagramSocketRefusesToStart) {
  const OwnedFd dgram = BoundSocket(dir_ / "dgram.sock", SOCK_DGRAM, /*listening=*/false);
  ASSERT_GE(dgram.get(), 0) << std::strerror(errno);
  SpawnOptions options;
  options.env = {"LISTEN_FDS=1"};
  options.pid_env = {"LISTEN_PID"};
  options.fds = {dgram.get()};
  const Run run = RunTrainerd({"--socket", dir_ / "sock", "--state-dir", dir_ / "state"}, options);
  EXPECT_TRUE(Exited(run.status, 1)) << run.status << "\n" << run.err;
  EXPECT_NE(run.err.find("not a listening unix stream socket"), std::string::npos) << run.err;
  EXPECT_FALSE(fs::exists(dir_ / "sock"));
}

// systemctl reload (ExecReload= sends SIGHUP): a bad file is reported and the
// running config kept; a good one takes effect. The log level shows which
// config runs: trainerd logs "every worker has stopped" at debug when it stops.
TEST_F(SystemdTest, SighupReloadsTheConfigAndKeepsTheRunningOneWhenTheFileIsBad) {
  DaemonOptions options;
  options.log_level = "";  // no --log-level: the file's log_level counts
  DaemonProcess d(dir_.path(), "log_level: info\n", options);
  d.Start();
  ASSERT_NE(d.pid(), -1);

  WriteFile(d.config_path(), "gpus: [cpu]\nlog_level: debug\nstop_grace: 5\n");
  size_t mark = d.log().size();
  d.Signal(SIGHUP);
  ASSERT_TRUE(d.WaitForLog("keeping the running config", seconds(10), mark)) << d.log();
  std::string reload = d.log().substr(mark);
  EXPECT_NE(reload.find(" error reload: " + d.config_path() +
                        ":3: unknown key 'stop_grace'; did you mean 'stop_grace_seconds'?"),
            std::string::npos)
      << reload;
  EXPECT_EQ(reload.find("reloaded the config"), std::string::npos) << reload;
  CtlResult list = d.Ctl({"list"}, seconds(10));
  EXPECT_EQ(list.exit_code, 0) << list.err << d.log();
  d.Signal(SIGTERM);
  ASSERT_TRUE(Exited(d.Wait(seconds(10)), 0)) << d.log();
  EXPECT_EQ(d.log().find(" debug "), std::string::npos) << "the bad file's log_level: debug was applied\n"
                                                        << d.log();

  d.Start();  // log_level: info again
  ASSERT_NE(d.pid(), -1);
  WriteFile(d.config_path(), "gpus: [cpu]\nstop_grace_seconds: 20\nlog_level: debug\n");
  mark = d.log().size();
  d.Signal(SIGHUP);
  ASSERT_TRUE(d.WaitForLog("reloaded the config", seconds(10), mark)) << d.log();
  reload = d.log().substr(mark);
  EXPECT_EQ(reload.find(" error "), std::string::npos) << reload;
  list = d.Ctl({"list"}, seconds(10));
  EXPECT_EQ(list.exit_code, 0) << list.err << d.log();
  d.Signal(SIGTERM);
  ASSERT_TRUE(Exited(d.Wait(seconds(10)), 0)) << d.log();
  EXPECT_NE(d.log().find(" debug every worker has stopped"), std::string::npos) << "log_level: debug not applied\n"
                                                                               << d.log();
}

TEST_F(SystemdTest, BadConfigAtStartExitsOneNamingFileLineAndKey) {
  const std::vector<std::string> where = {"--socket", dir_ / "sock", "--state-dir", dir_ / "state"};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), where.begin(), where.end());
    return args;
  };

  const std::string missing = dir_ / "missing.yaml";
  Run run = RunTrainerd(with({"--config", missing}));
  EXPECT_TRUE(Exited(run.status, 1)) << run.status << "\n" << run.err;
  EXPECT_NE(run.err.find("trainerd: error: "), std::string::npos) << run.err;
  EXPECT_NE(run.err.find(missing), std::string::npos) << run.err;

  const std::string config = dir_ / "trainerd.yaml";
  WriteFile(config, "gpus: [cpu]\nlog_levl: debug\n");
  run = RunTrainerd(with({"--config", config}));
  EXPECT_TRUE(Exited(run.status, 1)) << run.status << "\n" << run.err;
  EXPECT_NE(run.err.find(config + ":2: unknown key 'log_levl'; did you mean 'log_level'?"), std::string::npos)
      << run.err;

  WriteFile(config, "gpus: [cpu]\nstop_grace_seconds: 20\nlog_level: warning\n");
  run = RunTrainerd(with({"--config", config}));
  EXPECT_TRUE(Exited(run.status, 1)) << run.status << "\n" << run.err;
  EXPECT_NE(run.err.find(config + ":3: log_level: unknown value 'warning'"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("did you mean 'warn'?"), std::string::npos) << run.err;

  // None of them got as far as the state folder or the socket.
  EXPECT_FALSE(fs::exists(dir_ / "sock"));
  EXPECT_FALSE(fs::exists(dir_ / "state"));
}

TEST_F(SystemdTest, SecondDaemonOnTheSameSocketRefusesToStart) {
  DaemonProcess first(dir_.path());
  first.Start();
  ASSERT_NE(first.pid(), -1);
  const struct stat bound = FileIdentity(first.socket());

  const Run second = RunTrainerd({"--socket", first.socket(), "--state-dir", dir_ / "state2"});
  EXPECT_TRUE(Exited(second.status, 1)) << second.status << "\n" << second.err;
  EXPECT_NE(second.err.find("cannot start: another trainerd is listening on " + first.socket()), std::string::npos)
      << second.err;

  // The first one's socket is untouched and it still answers.
  const struct stat after = FileIdentity(first.socket());
  EXPECT_TRUE(after.st_ino == bound.st_ino && after.st_dev == bound.st_dev);
  CtlResult list = first.Ctl({"list"}, seconds(10));
  EXPECT_EQ(list.exit_code, 0) << list.err << first.log();
  first.Signal(SIGTERM);
  EXPECT_TRUE(Exited(first.Wait(seconds(10)), 0)) << first.log();
  EXPECT_FALSE(fs::exists(first.socket())) << "trainerd left the socket it bound itself";
}

}  // namespace
}  // namespace trainerd::integration
