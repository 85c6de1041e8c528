#include "daemon/child_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace trainerd::daemon {
namespace {

// Async-signal-safe write of a whole string (the child, after fork).
void WriteAll(int fd, const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t n = ::write(fd, text, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace

StatusOr<Child> SpawnChild(const ChildSpec& spec) {
  if (spec.argv.empty()) return Status::Error("no program to run");
  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls.
  std::vector<char*> argv;
  for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    if (spec.env.count(name) == 0) env_strings.push_back(entry);
  }
  for (const auto& [name, value] : spec.env) env_strings.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string exec_error = "trainerd: cannot run " + spec.argv[0] + ": ";

  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return Status::Error(std::string("pipe: ") + std::strerror(errno));
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) {
    ::close(out[0]);
    ::close(out[1]);
    return Status::Error(std::string("opening /dev/null: ") + std::strerror(errno));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(out[0]);
    ::close(out[1]);
    ::close(devnull);
    return Status::Error(std::string("fork: ") + std::strerror(err));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(126);  // trainerd died before the prctl
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
    // fd 3 first: dup2 onto 0-2 below could otherwise overwrite spec.fd3.
    int fd3 = spec.fd3;
    if (fd3 >= 0 && fd3 <= 2) fd3 = ::fcntl(fd3, F_DUPFD_CLOEXEC, 10);
    ::dup2(devnull, 0);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    if (fd3 == 3) {
      ::fcntl(3, F_SETFD, 0);  // keep it across exec
    } else if (fd3 >= 0) {
      ::dup2(fd3, 3);  // dup2 clears FD_CLOEXEC
    }
    // Close everything else trainerd had open (sockets, the store) that is not O_CLOEXEC.
    const int first = spec.fd3 >= 0 ? 4 : 3;
    const long max_fd = ::sysconf(_SC_OPEN_MAX);
    for (long fd = first; fd < (max_fd > 0 && max_fd < 65536 ? max_fd : 65536); ++fd) ::close(static_cast<int>(fd));
    if (::chdir(spec.working_dir.c_str()) != 0) {
      WriteAll(2, "trainerd: cannot enter the job's folder\n");
      ::_exit(127);
    }
    ::execve(argv[0], argv.data(), envp.data());
    const int err = errno;
    WriteAll(2, exec_error.c_str());
    WriteAll(2, std::strerror(err));
    WriteAll(2, "\n");
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(devnull);
  // Also from the parent: a signal sent to the group before the child's own
  // setpgid ran must still find the group.
  ::setpgid(pid, pid);
  return Child{pid, out[0]};
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* abbrev = sigabbrev_np(sig);
    return "killed by signal " + std::to_string(sig) + (abbrev ? std::string(" (SIG") + abbrev + ")" : "");
  }
  return "ended with wait status " + std::to_string(wait_status);
}

}  // namespace trainerd::daemon
