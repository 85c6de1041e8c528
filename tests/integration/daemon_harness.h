// The real programs for integration tests: a trainerd started on a temporary
// socket and state folder (DaemonProcess), and trainctl runs against it (Ctl).
// Both are the built binaries in bin/, run as child processes with their
// output in files.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace trainerd::integration {

inline const std::string kBin = std::string(TRAINERD_BINARY_DIR) + "/bin";
inline const std::string kTrainerd = kBin + "/trainerd";
inline const std::string kTrainctl = kBin + "/trainctl";
inline const std::string kModel = std::string(TRAINERD_FIXTURES) + "/llama/model";
inline const std::string kTrain = std::string(TRAINERD_FIXTURES) + "/llama/lora_train/train.jsonl";

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Runs `argv` with `env` added, stdout/stderr to `stem`.out/.err; returns the pid.
inline pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                   const std::string& stem) {
  const std::string out = stem + ".out", err = stem + ".err";
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in = ::open("/dev/null", O_RDONLY);
    if (o < 0 || e < 0 || in < 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(o, 1);
    ::dup2(e, 2);
    for (int fd = 3; fd < 1024; ++fd) ::close(fd);
    for (const auto& v : env) ::putenv(const_cast<char*>(v.c_str()));
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

// Waits for `pid` up to `timeout`; the wait status, or -1 after killing it on timeout.
inline int WaitFor(pid_t pid, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

inline bool CanConnect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// The pids whose parent is `parent` (from /proc).
inline std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  while (dirent* e = ::readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    const std::string stat = ReadFile("/proc/" + std::string(e->d_name) + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    int ppid = 0;
    char state = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent && state != 'Z') {
      out.push_back(pid);
    }
  }
  ::closedir(proc);
  return out;
}

struct CtlResult {
  int exit_code = -1;  // -1: killed on timeout or by a signal
  std::string out, err;
};

// A trainerd on `dir`/sock with state in `dir`/state, jobs on the CPU, and
// `config` (YAML lines) as its config file.
class DaemonProcess {
 public:
  DaemonProcess(std::string dir, std::string config = "") : dir_(std::move(dir)), config_(std::move(config)) {}
  ~DaemonProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      // Its workers get SIGTERM from the kernel (parent death); wait for them to go.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  std::string socket() const { return dir_ + "/sock"; }
  std::string state_dir() const { return dir_ + "/state"; }
  pid_t pid() const { return pid_; }
  // trainerd's stderr since its last Start; all_logs(): of every start.
  std::string log() const { return ReadFile(dir_ + "/trainerd-" + std::to_string(starts_) + ".err"); }
  std::string all_logs() const {
    std::string text;
    for (int i = 1; i <= starts_; ++i) text += "--- start " + std::to_string(i) + "\n" + ReadFile(dir_ + "/trainerd-" + std::to_string(i) + ".err");
    return text;
  }

  // Starts trainerd and waits until its socket answers.
  void Start() {
    WriteFile(dir_ + "/trainerd.yaml", "gpus: [cpu]\nstop_grace_seconds: 20\n" + config_);
    ++starts_;
    pid_ = Spawn({kTrainerd, "--config", dir_ + "/trainerd.yaml", "--socket", socket(), "--state-dir", state_dir(),
                  "--log-level", "debug"},
                 {}, dir_ + "/trainerd-" + std::to_string(starts_));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!CanConnect(socket()) && std::chrono::steady_clock::now() < deadline) {
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL() << "trainerd exited at start:\n" << log();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(CanConnect(socket())) << "trainerd did not listen within 10 s:\n" << log();
  }

  void Signal(int sig) { ::kill(pid_, sig); }

  // Waits for trainerd to exit; its wait status.
  int Wait(std::chrono::seconds timeout = std::chrono::seconds(60)) {
    const int status = WaitFor(pid_, timeout);
    pid_ = -1;
    return status;
  }

  // Runs trainctl ARGS against this daemon.
  CtlResult Ctl(const std::vector<std::string>& args, std::chrono::seconds timeout = std::chrono::seconds(120)) const {
    std::vector<std::string> argv{kTrainctl};
    argv.insert(argv.end(), args.begin(), args.end());
    static int counter = 0;
    const std::string stem = dir_ + "/trainctl-" + std::to_string(++counter);
    const pid_t pid = Spawn(argv, {"TRAINERD_SOCKET=" + socket()}, stem);
    const int status = WaitFor(pid, timeout);
    CtlResult r;
    r.exit_code = status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = ReadFile(stem + ".out");
    r.err = ReadFile(stem + ".err");
    return r;
  }

 private:
  std::string dir_;
  std::string config_;
  pid_t pid_ = -1;
  int starts_ = 0;
};

}  // namespace trainerd::integration
