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
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

extern char** environ;

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

// What a spawned child gets beyond its argv and output files.
struct SpawnOptions {
  std::vector<std::string> env;      // "NAME=value", added to (or replacing in) the environment
  std::vector<std::string> pid_env;  // NAMEs set to the child's own pid, known only after fork
                                     // (systemd's LISTEN_PID, WATCHDOG_PID)
  std::vector<int> fds;              // become the child's fds 3, 4, ... (as systemd passes sockets);
                                     // the caller keeps its own copies open
};

// Runs `argv` as `options` say, stdin from /dev/null, stdout/stderr to
// `stem`.out/.err, every other fd closed; returns the pid.
inline pid_t SpawnWith(const std::vector<std::string>& argv, const SpawnOptions& options, const std::string& stem) {
  const std::string out = stem + ".out", err = stem + ".err";
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // The environment is built before fork (after it, only async-signal-safe
  // calls): the pid variables get room for the digits the child writes.
  auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  std::vector<std::string> overrides = options.env;
  for (const auto& name : options.pid_env) overrides.push_back(name + "=");
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    bool replaced = false;
    for (const auto& o : overrides) replaced = replaced || name_of(o) == name_of(entry);
    if (!replaced) env.push_back(entry);
  }
  env.insert(env.end(), options.env.begin(), options.env.end());
  const size_t first_pid_entry = env.size();
  for (const auto& name : options.pid_env) env.push_back(name + "=" + std::string(20, '\0'));
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const int nfds = static_cast<int>(options.fds.size());
  std::vector<int> moved(options.fds.size());

  const pid_t pid = ::fork();
  if (pid == 0) {
    // The passed fds first go above 3..3+n (so none is overwritten), then into place.
    for (int i = 0; i < nfds; ++i) moved[i] = ::fcntl(options.fds[i], F_DUPFD, 3 + nfds);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in = ::open("/dev/null", O_RDONLY);
    if (o < 0 || e < 0 || in < 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(o, 1);
    ::dup2(e, 2);
    for (int i = 0; i < nfds; ++i) {
      if (moved[i] < 0 || ::dup2(moved[i], 3 + i) < 0) ::_exit(126);  // dup2 clears FD_CLOEXEC
    }
    for (int fd = 3 + nfds; fd < 1024; ++fd) ::close(fd);
    const pid_t self = ::getpid();
    for (size_t i = first_pid_entry; i < env.size(); ++i) {
      char digits[20];
      int n = 0;
      for (pid_t v = self; v > 0 && n < 20; v /= 10) digits[n++] = static_cast<char>('0' + v % 10);
      char* value = envp[i] + std::strlen(envp[i]);  // just after "NAME="
      while (n > 0) *value++ = digits[--n];
    }
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

// Runs `argv` with `env` added, stdout/stderr to `stem`.out/.err; returns the pid.
inline pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                   const std::string& stem) {
  SpawnOptions options;
  options.env = env;
  return SpawnWith(argv, options, stem);
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

// True while `pid` exists and is not a zombie.
inline bool IsRunning(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

struct CtlResult {
  int exit_code = -1;  // -1: killed on timeout or by a signal
  std::string out, err;
};

// How a DaemonProcess starts trainerd beyond its defaults.
struct DaemonOptions {
  std::string log_level = "debug";  // --log-level; empty: no flag, the config file's log_level counts
  SpawnOptions spawn;               // more environment and fds (systemd's NOTIFY_SOCKET, LISTEN_FDS, ...)
};

// A trainerd on `dir`/sock with state in `dir`/state, jobs on the CPU, and
// `config` (YAML lines) as its config file.
class DaemonProcess {
 public:
  DaemonProcess(std::string dir, std::string config = "", DaemonOptions options = {})
      : dir_(std::move(dir)), config_(std::move(config)), options_(std::move(options)) {}
  ~DaemonProcess() {
    if (pid_ > 0) {
      const std::vector<pid_t> workers = ChildrenOf(pid_);
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      // Its workers get SIGTERM from the kernel (parent death) and checkpoint;
      // wait for them to go, so nothing writes into the test's folder once it is removed.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      for (pid_t worker : workers) {
        while (IsRunning(worker) && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      }
    }
  }

  std::string socket() const { return dir_ + "/sock"; }
  std::string state_dir() const { return dir_ + "/state"; }
  // The config file Start writes; a test may rewrite it before a SIGHUP.
  std::string config_path() const { return dir_ + "/trainerd.yaml"; }
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
    Launch();
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

  // Starts trainerd (config file, flags, options) without waiting for anything.
  void Launch() {
    WriteFile(config_path(), "gpus: [cpu]\nstop_grace_seconds: 20\n" + config_);
    ++starts_;
    std::vector<std::string> argv{kTrainerd, "--config", config_path(), "--socket", socket(), "--state-dir", state_dir()};
    if (!options_.log_level.empty()) {
      argv.push_back("--log-level");
      argv.push_back(options_.log_level);
    }
    pid_ = SpawnWith(argv, options_.spawn, dir_ + "/trainerd-" + std::to_string(starts_));
  }

  void Signal(int sig) { ::kill(pid_, sig); }

  // Waits for trainerd to exit; its wait status.
  int Wait(std::chrono::seconds timeout = std::chrono::seconds(60)) {
    const int status = WaitFor(pid_, timeout);
    pid_ = -1;
    return status;
  }

  // Polls log() until it contains `text` after `from` (a position in it); false after `timeout`.
  bool WaitForLog(const std::string& text, std::chrono::milliseconds timeout, size_t from = 0) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (log().find(text, from) == std::string::npos) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
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
  DaemonOptions options_;
  pid_t pid_ = -1;
  int starts_ = 0;
};

}  // namespace trainerd::integration
