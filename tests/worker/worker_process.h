// Shared by the tests that run the real trainerd-worker binary (worker_cli_test,
// worker_events_test): where the binary and the tiny Llama fixture are, a
// child process with its output in files, and a fixture that writes job files.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/temp_dir.h"

namespace trainerd::worker::testing {

inline const std::string kWorker = std::string(TRAINERD_BINARY_DIR) + "/bin/trainerd-worker";
inline const std::string kModel = std::string(TRAINERD_FIXTURES) + "/llama/model";
inline const std::string kTrain = std::string(TRAINERD_FIXTURES) + "/llama/lora_train/train.jsonl";
inline const std::string kEval = std::string(TRAINERD_FIXTURES) + "/llama/eval.jsonl";

inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitStopped = 75;
// The fd a worker is given events on (worker_events_test).
inline constexpr int kEventsFd = 3;

// Longest a single worker run may take before the test kills it.
inline constexpr auto kRunTimeout = std::chrono::seconds(60);

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

inline std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A running trainerd-worker whose stdout and stderr go to files (no pipes, so
// a chatty child can never block on a full pipe), with `child_fd` as its fd 3
// (kEventsFd), or fd 3 closed when it is -1. Every other fd of the test is
// close-on-exec or closed in the child.
class WorkerProcess {
 public:
  // Starts the worker with `args`; logs land in `log_dir`.
  WorkerProcess(const std::vector<std::string>& args, const std::string& log_dir, int child_fd = -1) {
    static int counter = 0;
    const std::string stem = log_dir + "/worker-" + std::to_string(++counter);
    out_path_ = stem + ".stdout";
    err_path_ = stem + ".stderr";
    pid_ = ::fork();
    if (pid_ == 0) {
      int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (out < 0 || err < 0) ::_exit(126);
      ::dup2(out, STDOUT_FILENO);
      ::dup2(err, STDERR_FILENO);
      if (child_fd >= 0) {
        if (child_fd == kEventsFd) {
          ::fcntl(kEventsFd, F_SETFD, 0);  // keep it across exec
        } else if (::dup2(child_fd, kEventsFd) < 0) {
          ::_exit(126);
        }
      } else {
        ::close(kEventsFd);
      }
      // ctest -j runs these next to each other (and next to the torch tests) on
      // small machines, where LibTorch's spinning OpenMP threads slow a
      // contended run tenfold; one thread is as fast as two on the tiny fixture.
      ::setenv("OMP_NUM_THREADS", "1", /*overwrite=*/0);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(kWorker.c_str()));
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(kWorker.c_str(), argv.data());
      ::_exit(127);
    }
  }
  ~WorkerProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      int status;
      ::waitpid(pid_, &status, 0);
    }
  }
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  bool started() const { return pid_ > 0; }
  bool Signal(int sig) const { return ::kill(pid_, sig) == 0; }
  // True while the child has not exited (reaps it once it has).
  bool Running() {
    if (exited_) return false;
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) Record(status);
    return !exited_;
  }
  // Waits for the exit (killing the child after kRunTimeout); the exit status,
  // or -1 if it did not exit normally (signal() says which signal, if any).
  int Wait() {
    const auto deadline = std::chrono::steady_clock::now() + kRunTimeout;
    while (Running()) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "trainerd-worker ran longer than " << kRunTimeout.count() << " s; killed";
        ::kill(pid_, SIGKILL);
        int status;
        ::waitpid(pid_, &status, 0);
        Record(status);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return exit_code_;
  }
  int signal() const { return signal_; }
  std::string out() const { return ReadAll(out_path_); }
  std::string err() const { return ReadAll(err_path_); }

 private:
  void Record(int status) {
    exited_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    signal_ = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  }

  pid_t pid_ = -1;
  bool exited_ = false;
  int exit_code_ = -1;
  int signal_ = 0;
  std::string out_path_, err_path_;
};

// A temporary folder for job files, outputs and the worker's logs.
class WorkerBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed";
    ASSERT_TRUE(std::filesystem::exists(kWorker)) << kWorker << " is not built";
  }

  std::string PathOf(const std::string& name) const { return dir_.path() + "/" + name; }

  // Writes a job file and returns its path.
  std::string WriteJob(const std::string& name, const std::string& yaml) {
    const std::string path = PathOf(name);
    WriteText(path, yaml);
    return path;
  }

  // A LoRA finetune of the fixture on the CPU writing to `out_dir`;
  // `training` is the body of the training: section (indented two spaces).
  std::string LoraJobYaml(const std::string& out_dir, const std::string& training, bool with_eval) const {
    std::string yaml = "model:\n  path: " + kModel + "\nadapter:\n  r: 4\ndata:\n  train: " + kTrain + "\n";
    if (with_eval) yaml += "  eval: " + kEval + "\n";
    yaml += "training:\n" + training + "output:\n  dir: " + out_dir + "\ndevice: cpu\n";
    return yaml;
  }

  trainerd::testing::TempDir dir_;
};

}  // namespace trainerd::worker::testing
