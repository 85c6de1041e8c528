// Runs the real trainctl binary as a subprocess against the real socket
// server (trainerd::Server, daemon/server.h) on a temporary socket. The
// RequestHandler behind it is a script written here: it answers canned Replies
// and records the Requests it got. That scripted handler stands in for trainerd
// only in these client tests — it knows nothing of jobs; what trainerd really
// answers is tested with JobService (tests/daemon) and the integration tests.
//
// Checked here: what each command sends, what it prints, and its exit status
// for every outcome (ctl/exit_codes.h), including streams, a lost connection,
// Ctrl-C, usage errors, socket resolution, and `validate`, which needs no daemon.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ctl/exit_codes.h"
#include "daemon/server.h"
#include "tests/temp_dir.h"

extern char** environ;

namespace trainerd::ctl {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using nlohmann::json;
using trainerd::testing::TempDir;

// Built into bin/ with trainerd and trainerd-worker (ctl/CMakeLists.txt).
const std::string kTrainctl = std::string(TRAINERD_BINARY_DIR) + "/bin/trainctl";
const std::string kModel = std::string(TRAINERD_FIXTURES) + "/llama/model";

// Longest one trainctl run may take before the test kills it.
constexpr auto kRunTimeout = std::chrono::seconds(30);

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteText(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// How to start a trainctl.
struct RunOptions {
  // Variables set for the child, over the test's environment, from which
  // TRAINERD_SOCKET and XDG_RUNTIME_DIR are removed first.
  std::map<std::string, std::string> env;
  std::string cwd;    // empty: the test's
  bool as_nobody = false;  // run as uid/gid 65534 (the test must be root)
};

// A running trainctl whose stdout and stderr go to files.
class TrainctlProcess {
 public:
  TrainctlProcess(const std::vector<std::string>& args, const std::string& log_dir, const RunOptions& options) {
    static std::atomic<int> counter{0};
    const std::string stem = log_dir + "/trainctl-" + std::to_string(++counter);
    out_path_ = stem + ".stdout";
    err_path_ = stem + ".stderr";

    // Everything the child needs is built before fork (only async-signal-safe calls after it).
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const std::string name = entry.substr(0, entry.find('='));
      if (name == "TRAINERD_SOCKET" || name == "XDG_RUNTIME_DIR" || options.env.count(name) != 0) continue;
      env_strings.push_back(entry);
    }
    for (const auto& [name, value] : options.env) env_strings.push_back(name + "=" + value);
    std::vector<char*> envp;
    for (std::string& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_strings{kTrainctl};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& s : argv_strings) argv.push_back(s.data());
    argv.push_back(nullptr);
    const int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0 || err < 0) {
      ADD_FAILURE() << "cannot create " << stem << ".std{out,err}";
      return;
    }

    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out, STDOUT_FILENO);
      ::dup2(err, STDERR_FILENO);
      if (!options.cwd.empty() && ::chdir(options.cwd.c_str()) != 0) ::_exit(126);
      if (options.as_nobody && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(126);
      ::execve(kTrainctl.c_str(), argv.data(), envp.data());
      ::_exit(127);
    }
    ::close(out);
    ::close(err);
  }
  ~TrainctlProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      int status;
      ::waitpid(pid_, &status, 0);
    }
  }
  TrainctlProcess(const TrainctlProcess&) = delete;
  TrainctlProcess& operator=(const TrainctlProcess&) = delete;

  bool Signal(int sig) const { return pid_ > 0 && ::kill(pid_, sig) == 0; }

  // The exit status, or -1 when it did not exit normally (killed by a signal,
  // or by the test after kRunTimeout).
  int Wait() {
    const auto deadline = std::chrono::steady_clock::now() + kRunTimeout;
    while (pid_ > 0 && !exited_) {
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "trainctl ran longer than " << kRunTimeout.count() << " s; killed";
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        exited_ = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return exit_code_;
  }

  // Waits until stdout contains `text` (true) or `timeout` passes (false).
  bool WaitForOutput(const std::string& text, std::chrono::seconds timeout = std::chrono::seconds(10)) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (out().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  std::string out() const { return ReadAll(out_path_); }
  std::string err() const { return ReadAll(err_path_); }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int exit_code_ = -1;
  std::string out_path_, err_path_;
};

struct Outcome {
  int exit_code;
  std::string out, err;
};

// The daemon's part, scripted: per Request kind, a function that answers it.
// Runs on the server's io thread; the recorded Requests are read by the test
// thread, hence the lock.
class ScriptedHandler : public RequestHandler {
 public:
  using Script = std::function<void(const proto::Request&, ReplyWriter&)>;

  void On(proto::Request::KindCase kind, Script script) {
    std::lock_guard<std::mutex> lock(mu_);
    scripts_[kind] = std::move(script);
  }

  void Handle(const proto::Request& request, const PeerCredentials& peer, ReplyWriter& writer) override {
    Script script;
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(request);
      auto it = scripts_.find(request.kind_case());
      if (it != scripts_.end()) script = it->second;
    }
    if (script) {
      script(request, writer);
      return;
    }
    proto::Reply reply;
    reply.mutable_error()->set_code(proto::ERROR_CODE_INTERNAL);
    reply.mutable_error()->set_message("the test has no script for this request");
    writer.End(reply);
  }

  std::vector<proto::Request> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  std::mutex mu_;
  std::map<proto::Request::KindCase, Script> scripts_;
  std::vector<proto::Request> requests_;
};

// Scripts.
ScriptedHandler::Script Answer(proto::Reply reply) {
  return [reply](const proto::Request&, ReplyWriter& writer) { writer.End(reply); };
}

ScriptedHandler::Script Refuse(proto::ErrorCode code, const std::string& message) {
  proto::Reply reply;
  reply.mutable_error()->set_code(code);
  reply.mutable_error()->set_message(message);
  return Answer(reply);
}

proto::Job MakeJob(int64_t id, const std::string& name, proto::JobState state) {
  proto::Job job;
  job.set_id(id);
  job.set_name(name);
  job.set_owner_uid(::getuid());
  job.set_state(state);
  job.set_priority(0);
  job.set_submitted_unix_ms(1714572187000);
  job.set_attempt(1);
  return job;
}

// A wait answer: the ended job in the last Reply of a stream.
ScriptedHandler::Script WaitEndsWith(proto::Job job) {
  return [job](const proto::Request&, ReplyWriter& writer) {
    proto::Reply reply;
    *reply.mutable_wait()->mutable_job() = job;
    reply.set_end_of_stream(true);
    writer.End(reply);
  };
}

class TrainctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    ASSERT_TRUE(fs::exists(kTrainctl)) << kTrainctl << " is not built";
    socket_ = dir_ / "run/trainerd.sock";
    logs_ = dir_ / "logs";
    fs::create_directories(logs_);
    server_ = std::make_unique<Server>(io_, handler_);
    io_thread_ = std::thread([this] { io_.run(); });
    Status listening;
    OnIo([&] { listening = server_->Listen(socket_, 0600); });
    ASSERT_TRUE(listening.ok()) << listening.message();
  }

  void TearDown() override {
    OnIo([this] { server_->Stop(); });
    work_.reset();
    io_.stop();
    io_thread_.join();
    server_.reset();
  }

  // Runs `fn` on the io thread and waits for it.
  void OnIo(std::function<void()> fn) {
    std::promise<void> done;
    asio::post(io_, [&] {
      fn();
      done.set_value();
    });
    done.get_future().wait();
  }

  // Runs trainctl --socket SOCKET ARGS... to its end.
  Outcome Run(std::vector<std::string> args, RunOptions options = {}) {
    args.insert(args.begin(), {"--socket", socket_});
    return RunRaw(args, options);
  }
  // Runs trainctl ARGS... (no --socket added) to its end.
  Outcome RunRaw(const std::vector<std::string>& args, const RunOptions& options = {}) {
    TrainctlProcess p(args, logs_, options);
    const int code = p.Wait();
    return {code, p.out(), p.err()};
  }

  // Streams `lines` as one LogsReply each, ~10 ms apart, then ends the stream
  // (a stream as trainerd sends it while a job runs).
  void StreamLines(ReplyWriter writer, std::vector<std::string> lines, size_t i = 0) {
    auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(10));
    timer->async_wait([this, timer, writer, lines = std::move(lines), i](const boost::system::error_code&) mutable {
      if (!writer.open()) return;
      if (i == lines.size()) {
        writer.EndStream();
        return;
      }
      proto::Reply reply;
      reply.mutable_logs()->add_lines()->set_text(lines[i]);
      writer.Send(reply);
      StreamLines(writer, std::move(lines), i + 1);
    });
  }

  ScriptedHandler::Script StreamLinesScript(std::vector<std::string> lines) {
    return [this, lines](const proto::Request&, ReplyWriter& writer) { StreamLines(writer, lines); };
  }

  // A valid job spec in the temp dir (`name` relative to it), with its data
  // file beside it under data/, referenced by a relative path.
  std::string WriteSpec(const std::string& name, const std::string& training = "  learning_rate: 1.0e-4\n") {
    const std::string path = dir_ / name;
    WriteText((fs::path(path).parent_path() / "data/train.jsonl").string(), "{\"input_ids\": [1, 2, 3]}\n");
    WriteText(path, "model:\n  path: " + kModel +
                        "\n"
                        "adapter:\n  r: 4\n"
                        "data:\n  train: data/train.jsonl\n  format: tokens\n"
                        "training:\n" +
                        training + "device: cpu\n");
    return path;
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  ScriptedHandler handler_;
  std::unique_ptr<Server> server_;
  std::thread io_thread_;
  TempDir dir_;
  std::string socket_;
  std::string logs_;
};

// ---------------------------------------------------------------------------
// submit

TEST_F(TrainctlTest, SubmitSendsTheSpecWithSourceAndBaseDirAndPrintsTheId) {
  const std::string spec_path = WriteSpec("specs/llama-lora.yaml");
  proto::Reply reply;
  reply.mutable_submit()->set_job_id(7);
  reply.mutable_submit()->set_name("llama-lora");  // the daemon names the job
  handler_.On(proto::Request::kSubmit, Answer(reply));

  // FILE relative to trainctl's working folder, as a user types it.
  RunOptions options;
  options.cwd = dir_.path();
  Outcome r = Run({"submit", "specs/llama-lora.yaml"}, options);
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "submitted job 7 (llama-lora)\n");
  EXPECT_EQ(r.err, "");

  auto requests = handler_.requests();
  ASSERT_EQ(requests.size(), 1u);
  ASSERT_TRUE(requests[0].has_submit());
  const proto::SubmitRequest& submit = requests[0].submit();
  EXPECT_EQ(submit.spec().yaml(), ReadAll(spec_path));
  EXPECT_EQ(submit.spec().source(), "specs/llama-lora.yaml");
  // The spec file's folder (not trainctl's working folder), absolute.
  EXPECT_EQ(submit.spec().base_dir(), fs::canonical(dir_ / "specs").string());
  EXPECT_EQ(submit.name(), "");
  EXPECT_EQ(submit.priority(), 0);
}

TEST_F(TrainctlTest, SubmitSendsNameAndPriority) {
  WriteSpec("job.yaml");
  proto::Reply reply;
  reply.mutable_submit()->set_job_id(8);
  reply.mutable_submit()->set_name("my run");  // the daemon names the job
  handler_.On(proto::Request::kSubmit, Answer(reply));
  Outcome r = Run({"submit", dir_ / "job.yaml", "--name", "my run", "--priority", "-3"});
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "submitted job 8 (my run)\n");
  auto requests = handler_.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].submit().name(), "my run");
  EXPECT_EQ(requests[0].submit().priority(), -3);
  EXPECT_EQ(requests[0].submit().spec().source(), dir_ / "job.yaml");
}

TEST_F(TrainctlTest, SubmitParsablePrintsOnlyTheId) {
  WriteSpec("job.yaml");
  proto::Reply reply;
  reply.mutable_submit()->set_job_id(42);
  handler_.On(proto::Request::kSubmit, Answer(reply));
  Outcome r = Run({"submit", "--parsable", dir_ / "job.yaml"});
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "42\n");
}

TEST_F(TrainctlTest, SubmitOfAMissingFileIsAUsageErrorAndSendsNothing) {
  Outcome r = Run({"submit", dir_ / "nope.yaml"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.err.find("trainctl: error: cannot read job spec " + dir_ / "nope.yaml"), std::string::npos) << r.err;
  EXPECT_TRUE(handler_.requests().empty());
}

TEST_F(TrainctlTest, SubmitRejectedByTrainerdExits6WithItsMessage) {
  WriteSpec("job.yaml");
  handler_.On(proto::Request::kSubmit,
              Refuse(proto::ERROR_CODE_BAD_REQUEST, "job.yaml:7: training.learning_rate: expected a number"));
  Outcome r = Run({"submit", dir_ / "job.yaml"});
  EXPECT_EQ(r.exit_code, kExitRejected);
  EXPECT_EQ(r.err, "trainctl: error: job.yaml:7: training.learning_rate: expected a number\n");
  EXPECT_EQ(r.out, "");
}

TEST_F(TrainctlTest, SubmitWaitExitsWithTheJobsOutcome) {
  WriteSpec("job.yaml");
  proto::Reply submitted;
  submitted.mutable_submit()->set_job_id(9);
  submitted.mutable_submit()->set_name("job");  // the daemon names the job
  handler_.On(proto::Request::kSubmit, Answer(submitted));
  proto::Job done = MakeJob(9, "job", proto::JOB_STATE_SUCCEEDED);
  done.mutable_result()->set_output_path("/out/adapter");
  handler_.On(proto::Request::kWait, WaitEndsWith(done));
  Outcome r = Run({"submit", "--wait", dir_ / "job.yaml"});
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "submitted job 9 (job)\njob 9 (job) succeeded; outputs: /out/adapter\n");
  auto requests = handler_.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].wait().job_id(), 9);

  proto::Job failed = MakeJob(9, "job", proto::JOB_STATE_FAILED);
  failed.set_reason("loss is NaN at step 3");
  handler_.On(proto::Request::kWait, WaitEndsWith(failed));
  r = Run({"submit", "--wait", dir_ / "job.yaml"});
  EXPECT_EQ(r.exit_code, kExitJobFailed);
  EXPECT_NE(r.err.find("job 9 (job) failed: loss is NaN at step 3"), std::string::npos) << r.err;
}

TEST_F(TrainctlTest, SubmitFollowStreamsTheLogThenExitsWithTheOutcome) {
  WriteSpec("job.yaml");
  proto::Reply submitted;
  submitted.mutable_submit()->set_job_id(11);
  submitted.mutable_submit()->set_name("job");  // the daemon names the job
  handler_.On(proto::Request::kSubmit, Answer(submitted));
  handler_.On(proto::Request::kLogs, StreamLinesScript({"step 1 loss 2.0", "step 2 loss 1.5"}));
  proto::Job failed = MakeJob(11, "job", proto::JOB_STATE_FAILED);
  failed.set_reason("CUDA out of memory");
  failed.mutable_result()->set_exit_code(1);
  handler_.On(proto::Request::kWait, WaitEndsWith(failed));

  Outcome r = Run({"submit", "--follow", dir_ / "job.yaml"});
  EXPECT_EQ(r.exit_code, kExitJobFailed) << r.err;
  EXPECT_EQ(r.out, "submitted job 11 (job)\nstep 1 loss 2.0\nstep 2 loss 1.5\n");
  EXPECT_NE(r.err.find("job 11 (job) failed (worker exit code 1): CUDA out of memory"), std::string::npos) << r.err;
  // One connection, three requests in order: submit, logs -f from the start, wait.
  auto requests = handler_.requests();
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_TRUE(requests[0].has_submit());
  EXPECT_EQ(requests[1].logs().job_id(), 11);
  EXPECT_TRUE(requests[1].logs().follow());
  EXPECT_EQ(requests[1].logs().tail(), 0);
  EXPECT_EQ(requests[2].wait().job_id(), 11);
}

// ---------------------------------------------------------------------------
// Errors from trainerd and from the transport

TEST_F(TrainctlTest, EachErrorCodeHasItsExitStatusAndTheMessageReachesStderr) {
  const std::vector<std::pair<proto::ErrorCode, int>> cases = {
      {proto::ERROR_CODE_BAD_REQUEST, kExitRejected},
      {proto::ERROR_CODE_NOT_FOUND, kExitNotFound},
      {proto::ERROR_CODE_PERMISSION_DENIED, kExitPermissionDenied},
      {proto::ERROR_CODE_INTERNAL, kExitInternal},
  };
  for (const auto& [code, exit_code] : cases) {
    const std::string message = "scripted " + proto::ErrorCode_Name(code);
    handler_.On(proto::Request::kStatus, Refuse(code, message));
    Outcome r = Run({"status", "3"});
    EXPECT_EQ(r.exit_code, exit_code) << proto::ErrorCode_Name(code);
    EXPECT_EQ(r.err, "trainctl: error: " + message + "\n");
    EXPECT_EQ(r.out, "");
  }
}

TEST_F(TrainctlTest, ErrorCodesMapTheSameForEveryCommand) {
  handler_.On(proto::Request::kCancel, Refuse(proto::ERROR_CODE_PERMISSION_DENIED, "job 3 belongs to uid 0"));
  handler_.On(proto::Request::kLogs, Refuse(proto::ERROR_CODE_NOT_FOUND, "no job 3"));
  handler_.On(proto::Request::kWait, Refuse(proto::ERROR_CODE_NOT_FOUND, "no job 3"));
  handler_.On(proto::Request::kList, Refuse(proto::ERROR_CODE_INTERNAL, "database is locked"));
  EXPECT_EQ(Run({"cancel", "3"}).exit_code, kExitPermissionDenied);
  EXPECT_EQ(Run({"logs", "3"}).exit_code, kExitNotFound);
  EXPECT_EQ(Run({"logs", "-f", "3"}).exit_code, kExitNotFound);
  EXPECT_EQ(Run({"wait", "3"}).exit_code, kExitNotFound);
  EXPECT_EQ(Run({"list"}).exit_code, kExitInternal);
}

TEST_F(TrainctlTest, MissingSocketExits3NamingThePath) {
  const std::string missing = dir_ / "none/trainerd.sock";
  Outcome r = RunRaw({"--socket", missing, "list"});
  EXPECT_EQ(r.exit_code, kExitUnreachable);
  EXPECT_NE(r.err.find("trainctl: error: cannot connect to trainerd at " + missing), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("is trainerd running"), std::string::npos) << r.err;
}

TEST_F(TrainctlTest, SocketWeMayNotUseExits4) {
  RunOptions options;
  if (::geteuid() == 0) {
    options.as_nobody = true;  // root may use any socket; nobody may not enter the 0700 temp dir
  } else {
    ASSERT_EQ(::chmod(socket_.c_str(), 0), 0);
  }
  Outcome r = Run({"list"}, options);
  EXPECT_EQ(r.exit_code, kExitPermissionDenied) << r.err;
  EXPECT_NE(r.err.find(socket_), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("permission denied"), std::string::npos) << r.err;
}

TEST_F(TrainctlTest, ConnectionClosedMidStreamExits3) {
  handler_.On(proto::Request::kLogs, [this](const proto::Request&, ReplyWriter& writer) {
    proto::Reply reply;
    reply.mutable_logs()->add_lines()->set_text("first");
    writer.Send(reply);
    // The daemon goes away before ending the stream (after the line has had
    // ample time to be written: Stop drops what is still queued).
    auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(200));
    timer->async_wait([this, timer](const boost::system::error_code&) { server_->Stop(); });
  });
  Outcome r = Run({"logs", "-f", "5"});
  EXPECT_EQ(r.exit_code, kExitUnreachable);
  EXPECT_EQ(r.out, "first\n");
  EXPECT_NE(r.err.find("closed the connection before the end of the answer to a logs request"), std::string::npos)
      << r.err;
}

TEST_F(TrainctlTest, ReplyOfTheWrongKindExits3) {
  proto::Reply list;
  list.mutable_list();
  handler_.On(proto::Request::kStatus, Answer(list));
  Outcome r = Run({"status", "3"});
  EXPECT_EQ(r.exit_code, kExitUnreachable);
  EXPECT_NE(r.err.find("answered a status request with a list reply"), std::string::npos) << r.err;
}

TEST_F(TrainctlTest, TrainerdSocketEnvironmentVariableIsHonoured) {
  proto::Reply empty;
  empty.mutable_list();
  handler_.On(proto::Request::kList, Answer(empty));
  RunOptions options;
  options.env["TRAINERD_SOCKET"] = socket_;
  Outcome r = RunRaw({"list"}, options);
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_EQ(handler_.requests().size(), 1u);

  // --socket wins over the variable.
  options.env["TRAINERD_SOCKET"] = dir_ / "elsewhere.sock";
  r = RunRaw({"--socket", socket_, "list"}, options);
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
  // And a wrong variable is named as the origin of the path.
  r = RunRaw({"list"}, options);
  EXPECT_EQ(r.exit_code, kExitUnreachable);
  EXPECT_NE(r.err.find(dir_ / "elsewhere.sock"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("TRAINERD_SOCKET"), std::string::npos) << r.err;
}

TEST_F(TrainctlTest, UserDaemonSocketIsFoundUnderXdgRuntimeDir) {
  // A runtime dir whose trainerd/trainerd.sock is our server's socket (a symlink to it).
  const std::string runtime = dir_ / "xdg";
  fs::create_directories(runtime + "/trainerd");
  fs::create_symlink(socket_, runtime + "/trainerd/trainerd.sock");
  proto::Reply empty;
  empty.mutable_list();
  handler_.On(proto::Request::kList, Answer(empty));
  RunOptions options;
  options.env["XDG_RUNTIME_DIR"] = runtime;
  Outcome r = RunRaw({"list"}, options);
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_EQ(handler_.requests().size(), 1u);
}

// ---------------------------------------------------------------------------
// Usage errors: exit 2, nothing sent

TEST_F(TrainctlTest, UsageErrorsExit2) {
  const std::vector<std::vector<std::string>> cases = {
      {},                                 // no command
      {"frobnicate"},                     // unknown command
      {"list", "--bogus"},                // unknown option
      {"status"},                         // missing JOB
      {"status", "abc"},                  // not a number
      {"status", "0"},                    // not a job id
      {"cancel"},                         // no ids
      {"logs", "3", "--tail", "-1"},      // negative tail
      {"list", "--state", "sleeping"},    // unknown state
      {"submit"},                         // no FILE
      {"submit", "x.yaml", "--priority", "high"},
      {"validate"},
  };
  for (const auto& args : cases) {
    Outcome r = Run(args);
    std::string joined;
    for (const auto& a : args) joined += " " + a;
    EXPECT_EQ(r.exit_code, kExitUsage) << "trainctl" << joined << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("trainctl: error: ", 0), 0u) << "trainctl" << joined << "\n" << r.err;
  }
  EXPECT_TRUE(handler_.requests().empty());
}

TEST_F(TrainctlTest, HelpExits0AndListsTheExitStatuses) {
  Outcome r = RunRaw({"--help"});
  EXPECT_EQ(r.exit_code, kExitOk);
  for (const char* part : {"submit", "list", "status", "cancel", "logs", "wait", "validate", "Exit status:",
                           "TRAINERD_SOCKET", "130"}) {
    EXPECT_NE(r.out.find(part), std::string::npos) << part << " missing from:\n" << r.out;
  }
  for (const char* command : {"submit", "list", "status", "cancel", "logs", "wait", "validate"}) {
    Outcome sub = RunRaw({command, "--help"});
    EXPECT_EQ(sub.exit_code, kExitOk) << command;
    EXPECT_NE(sub.out.find(std::string("Usage: trainctl ") + command), std::string::npos) << sub.out;
  }
}

// ---------------------------------------------------------------------------
// logs

TEST_F(TrainctlTest, LogsPrintsTheLinesOfOneReply) {
  proto::Reply reply;
  reply.mutable_logs()->add_lines()->set_text("a");
  reply.mutable_logs()->add_lines()->set_text("b\n");  // a line that keeps its newline gets no second one
  handler_.On(proto::Request::kLogs, Answer(reply));
  Outcome r = Run({"logs", "4", "-n", "2"});
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "a\nb\n");
  auto requests = handler_.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].logs().job_id(), 4);
  EXPECT_EQ(requests[0].logs().tail(), 2);
  EXPECT_FALSE(requests[0].logs().follow());
}

TEST_F(TrainctlTest, LogsFollowPrintsStreamedLinesUntilEndOfStream) {
  handler_.On(proto::Request::kLogs, StreamLinesScript({"line 0", "line 1", "line 2"}));
  Outcome r = Run({"logs", "-f", "5", "--tail", "10"});
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "line 0\nline 1\nline 2\n");
  EXPECT_EQ(r.err, "");
  auto requests = handler_.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_TRUE(requests[0].logs().follow());
  EXPECT_EQ(requests[0].logs().tail(), 10);
}

TEST_F(TrainctlTest, CtrlCDuringLogsFollowExits130) {
  auto held = std::make_shared<std::optional<ReplyWriter>>();
  handler_.On(proto::Request::kLogs, [held](const proto::Request&, ReplyWriter& writer) {
    proto::Reply reply;
    reply.mutable_logs()->add_lines()->set_text("running...");
    writer.Send(reply);
    *held = writer;  // the stream stays open: the job never ends
    writer.OnClose([held] { held->reset(); });
  });
  std::vector<std::string> args = {"--socket", socket_, "logs", "-f", "5"};
  TrainctlProcess p(args, logs_, {});
  ASSERT_TRUE(p.WaitForOutput("running...\n")) << p.err();
  ASSERT_TRUE(p.Signal(SIGINT));
  EXPECT_EQ(p.Wait(), kExitInterrupted);
  OnIo([held] { held->reset(); });
}

// ---------------------------------------------------------------------------
// wait

TEST_F(TrainctlTest, WaitExits0WhenTheJobSucceeded) {
  proto::Job job = MakeJob(6, "tiny", proto::JOB_STATE_SUCCEEDED);
  job.mutable_progress()->set_elapsed_seconds(185);
  job.set_output_dir("/out");
  handler_.On(proto::Request::kWait, WaitEndsWith(job));
  Outcome r = Run({"wait", "6"});
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "job 6 (tiny) succeeded in 3m 05s; outputs: /out\n");
  EXPECT_EQ(handler_.requests().at(0).wait().job_id(), 6);

  r = Run({"wait", "--quiet", "6"});
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_F(TrainctlTest, WaitExits1WhenTheJobFailedOrWasCancelled) {
  proto::Job failed = MakeJob(6, "tiny", proto::JOB_STATE_FAILED);
  failed.set_reason("worker crashed");
  failed.mutable_result()->set_signal(SIGSEGV);
  handler_.On(proto::Request::kWait, WaitEndsWith(failed));
  Outcome r = Run({"wait", "6"});
  EXPECT_EQ(r.exit_code, kExitJobFailed);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("job 6 (tiny) failed (worker killed by SIGSEGV): worker crashed"), std::string::npos) << r.err;

  proto::Job cancelled = MakeJob(6, "tiny", proto::JOB_STATE_CANCELLED);
  cancelled.set_reason("cancelled by uid 1000");
  handler_.On(proto::Request::kWait, WaitEndsWith(cancelled));
  r = Run({"wait", "6"});
  EXPECT_EQ(r.exit_code, kExitJobFailed);
  EXPECT_NE(r.err.find("job 6 (tiny) was cancelled: cancelled by uid 1000"), std::string::npos) << r.err;
}

TEST_F(TrainctlTest, WaitSkipsEarlierRepliesOfTheStream) {
  handler_.On(proto::Request::kWait, [](const proto::Request&, ReplyWriter& writer) {
    proto::Reply alive;  // a reply without the job, before the last one
    alive.mutable_wait();
    writer.Send(alive);
    proto::Reply last;
    *last.mutable_wait()->mutable_job() = MakeJob(6, "tiny", proto::JOB_STATE_SUCCEEDED);
    last.set_end_of_stream(true);
    writer.End(last);
  });
  Outcome r = Run({"wait", "6"});
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
}

TEST_F(TrainctlTest, WaitEndedWithoutTheJobIsAProtocolError) {
  handler_.On(proto::Request::kWait, [](const proto::Request&, ReplyWriter& writer) { writer.EndStream(); });
  Outcome r = Run({"wait", "6"});
  EXPECT_EQ(r.exit_code, kExitUnreachable);
  EXPECT_NE(r.err.find("without saying how the job ended"), std::string::npos) << r.err;
}

// ---------------------------------------------------------------------------
// list, status, cancel

TEST_F(TrainctlTest, ListJsonIsAnArrayOfJobsWithTheDocumentedFields) {
  proto::Reply reply;
  proto::Job running = MakeJob(7, "llama-lora", proto::JOB_STATE_RUNNING);
  running.set_device("cuda:0");
  running.mutable_progress()->set_step(450);
  running.mutable_progress()->set_total_steps(1000);
  *reply.mutable_list()->add_jobs() = running;
  *reply.mutable_list()->add_jobs() = MakeJob(8, "queued-one", proto::JOB_STATE_QUEUED);
  handler_.On(proto::Request::kList, Answer(reply));

  Outcome r = Run({"list", "--json", "--all"});
  ASSERT_EQ(r.exit_code, kExitOk) << r.err;
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_array()) << r.out;
  ASSERT_EQ(j.size(), 2u);
  for (const char* key : {"id", "name", "owner_uid", "owner", "state", "priority", "submitted_unix_ms",
                          "started_unix_ms", "finished_unix_ms", "attempt", "device", "output_dir", "reason",
                          "progress", "result"}) {
    EXPECT_TRUE(j[0].contains(key)) << key;
  }
  EXPECT_EQ(j[0]["id"], 7);
  EXPECT_EQ(j[0]["state"], "running");
  EXPECT_EQ(j[0]["device"], "cuda:0");
  EXPECT_EQ(j[0]["owner_uid"], ::getuid());
  EXPECT_EQ(j[0]["progress"]["step"], 450);
  EXPECT_EQ(j[0]["progress"]["total_steps"], 1000);
  EXPECT_EQ(j[1]["state"], "queued");
  EXPECT_TRUE(handler_.requests().at(0).list().all());
}

TEST_F(TrainctlTest, ListFollowsPagesUntilNextAfterIdIsZero) {
  // Page 1: jobs 1 and 2, more after 2; page 2: job 3, the last.
  handler_.On(proto::Request::kList, [](const proto::Request& request, ReplyWriter& writer) {
    proto::Reply reply;
    if (request.list().after_id() == 0) {
      *reply.mutable_list()->add_jobs() = MakeJob(1, "a", proto::JOB_STATE_SUCCEEDED);
      *reply.mutable_list()->add_jobs() = MakeJob(2, "b", proto::JOB_STATE_FAILED);
      reply.mutable_list()->set_next_after_id(2);
    } else {
      *reply.mutable_list()->add_jobs() = MakeJob(3, "c", proto::JOB_STATE_QUEUED);
    }
    writer.End(reply);
  });
  Outcome r = Run({"list", "--all", "--json"});
  ASSERT_EQ(r.exit_code, kExitOk) << r.err;
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_array()) << r.out;
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[2]["id"], 3);
  ASSERT_EQ(handler_.requests().size(), 2u);
  EXPECT_EQ(handler_.requests()[1].list().after_id(), 2);
  EXPECT_TRUE(handler_.requests()[1].list().all());
}

TEST_F(TrainctlTest, ListSendsTheStatesAsked) {
  proto::Reply reply;
  reply.mutable_list();
  handler_.On(proto::Request::kList, Answer(reply));
  Outcome r = Run({"list", "--state", "failed", "--state", "cancelled,interrupted"});
  ASSERT_EQ(r.exit_code, kExitOk) << r.err;
  const proto::ListRequest list = handler_.requests().at(0).list();
  EXPECT_FALSE(list.all());
  ASSERT_EQ(list.states_size(), 3);
  EXPECT_EQ(list.states(0), proto::JOB_STATE_FAILED);
  EXPECT_EQ(list.states(1), proto::JOB_STATE_CANCELLED);
  EXPECT_EQ(list.states(2), proto::JOB_STATE_INTERRUPTED);
  // Off a terminal an empty list is still the header: scripts see the columns.
  EXPECT_EQ(r.out.rfind("ID  NAME", 0), 0u) << r.out;
}

TEST_F(TrainctlTest, ListOffATerminalIsAPlainAlignedTable) {
  proto::Reply reply;
  *reply.mutable_list()->add_jobs() = MakeJob(7, "llama-lora", proto::JOB_STATE_RUNNING);
  *reply.mutable_list()->add_jobs() = MakeJob(12, "x", proto::JOB_STATE_QUEUED);
  handler_.On(proto::Request::kList, Answer(reply));
  Outcome r = Run({"list"});
  ASSERT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << "no colour off a terminal";
  std::vector<std::string> lines;
  for (size_t at = 0, nl; (nl = r.out.find('\n', at)) != std::string::npos; at = nl + 1) {
    lines.push_back(r.out.substr(at, nl - at));
  }
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_EQ(lines[0].rfind("ID  NAME        STATE    OWNER", 0), 0u) << r.out;
  EXPECT_EQ(lines[1].rfind(" 7  llama-lora  running  ", 0), 0u) << r.out;
  EXPECT_EQ(lines[2].rfind("12  x           queued   ", 0), 0u) << r.out;
  // Columns line up: STATE starts at the same offset on every line.
  EXPECT_EQ(lines[0].find("STATE"), lines[1].find("running"));
  EXPECT_EQ(lines[0].find("STATE"), lines[2].find("queued"));
}

TEST_F(TrainctlTest, StatusShowsTheProgressBarAndFigures) {
  proto::Job job = MakeJob(7, "llama-lora", proto::JOB_STATE_RUNNING);
  job.set_device("cuda:0");
  job.mutable_progress()->set_step(450);
  job.mutable_progress()->set_total_steps(1000);
  job.mutable_progress()->set_loss(1.5);
  job.mutable_progress()->set_peak_memory_bytes(int64_t{3} << 30);
  job.mutable_progress()->set_eta_seconds(125);
  proto::Reply reply;
  *reply.mutable_status()->mutable_job() = job;
  handler_.On(proto::Request::kStatus, Answer(reply));

  Outcome r = Run({"status", "7"});
  ASSERT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_EQ(r.out.rfind("job 7 (llama-lora): running\n", 0), 0u) << r.out;
  for (const char* part : {"[#########-----------] 45%", "step 450/1000", "1.5000", "3.0 GiB", "2m 05s", "cuda:0"}) {
    EXPECT_NE(r.out.find(part), std::string::npos) << part << " missing from:\n" << r.out;
  }
  EXPECT_EQ(handler_.requests().at(0).status().job_id(), 7);
}

TEST_F(TrainctlTest, StatusJsonIsOneObjectWithTheSpec) {
  proto::Job job = MakeJob(7, "llama-lora", proto::JOB_STATE_FAILED);
  job.set_reason("boom");
  job.mutable_result()->set_exit_code(1);
  job.mutable_spec()->set_source("llama.yaml");
  proto::Reply reply;
  *reply.mutable_status()->mutable_job() = job;
  handler_.On(proto::Request::kStatus, Answer(reply));
  Outcome r = Run({"status", "--json", "7"});
  ASSERT_EQ(r.exit_code, kExitOk) << r.err;
  json j = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["state"], "failed");
  EXPECT_EQ(j["reason"], "boom");
  EXPECT_EQ(j["result"]["exit_code"], 1);
  EXPECT_EQ(j["spec"]["source"], "llama.yaml");
}

TEST_F(TrainctlTest, CancelPrintsWhatWasCancelled) {
  proto::Reply reply;
  reply.mutable_cancel()->add_cancelled(3);
  reply.mutable_cancel()->add_cancelled(4);
  handler_.On(proto::Request::kCancel, Answer(reply));
  Outcome r = Run({"cancel", "3", "4"});
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "cancelled job 3\ncancelled job 4\n");
  const proto::CancelRequest cancel = handler_.requests().at(0).cancel();
  ASSERT_EQ(cancel.job_ids_size(), 2);
  EXPECT_EQ(cancel.job_ids(0), 3);
  EXPECT_EQ(cancel.job_ids(1), 4);
}

// ---------------------------------------------------------------------------
// validate: local, no daemon

TEST_F(TrainctlTest, ValidateAcceptsAGoodSpecWithPathsRelativeToItsFolder) {
  WriteSpec("specs/good.yaml");
  RunOptions options;
  options.cwd = "/";  // relative paths resolve against the spec's folder, not here
  Outcome r = RunRaw({"--socket", dir_ / "no-daemon.sock", "validate", dir_ / "specs/good.yaml"}, options);
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_EQ(r.out, dir_ / "specs/good.yaml" + ": ok\n");
  EXPECT_TRUE(handler_.requests().empty());
}

TEST_F(TrainctlTest, ValidateOfABadSpecExits6NamingEachKeyAndLineOnALineOfItsOwn) {
  // training's keys start on line 9 of the file WriteSpec writes.
  WriteSpec("bad.yaml", "  learning_rate: fast\n  epochs: lots\n");
  RunOptions options;
  options.cwd = dir_.path();
  Outcome r = RunRaw({"validate", "bad.yaml"}, options);
  EXPECT_EQ(r.exit_code, kExitRejected);
  EXPECT_EQ(r.err.rfind("trainctl: error: bad.yaml:9: training.learning_rate: expected a number", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("\ntrainctl: error: bad.yaml:10: training.epochs: expected a number"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_F(TrainctlTest, ValidateOfAMissingDataFileExits6NamingTheKey) {
  const std::string spec = WriteSpec("job.yaml");
  fs::remove(dir_ / "data/train.jsonl");
  Outcome r = RunRaw({"validate", spec});
  EXPECT_EQ(r.exit_code, kExitRejected);
  EXPECT_NE(r.err.find("data.train"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(dir_ / "data/train.jsonl"), std::string::npos) << r.err;
}

TEST_F(TrainctlTest, ValidateNamesEveryFileThatIsNotThere) {
  const std::string spec = dir_ / "files.yaml";
  WriteText(spec, "model:\n  path: no-model\ndata:\n  train: no-train.jsonl\n  eval: no-eval.jsonl\ndevice: cpu\n");
  Outcome r = RunRaw({"validate", spec});
  EXPECT_EQ(r.exit_code, kExitRejected);
  for (const std::string& key : {"model.path: " + (dir_ / "no-model"), "data.train: " + (dir_ / "no-train.jsonl"),
                                "data.eval: " + (dir_ / "no-eval.jsonl")}) {
    EXPECT_NE(r.err.find("trainctl: error: " + spec + ": " + key), std::string::npos) << key << "\n" << r.err;
  }
}

TEST_F(TrainctlTest, ValidateOfAMissingFileIsAUsageError) {
  Outcome r = RunRaw({"validate", dir_ / "nope.yaml"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.err.find("nope.yaml"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace trainerd::ctl
