// Starting trainerd's child processes (trainerd-worker runs and its `devices`
// query) with fork + exec, set up the way the supervisor needs them.
//
// The child gets: its own process group (so a signal to -pid reaches the
// worker and anything it started, and a Ctrl-C at trainerd's terminal does
// not), SIGTERM when trainerd dies (PR_SET_PDEATHSIG: a trainerd killed with
// SIGKILL leaves no worker training on unsupervised; it checkpoints and
// exits), stdin from /dev/null, stdout and stderr into one pipe trainerd
// reads, optionally one more fd at number 3 (the events socket), the default
// signal dispositions and an empty signal mask, and no other fd of trainerd's.
//
// Threading: call from the thread that will outlive the child (PDEATHSIG fires
// when the forking *thread* exits): the daemon's main thread.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace trainerd::daemon {

struct ChildSpec {
  std::vector<std::string> argv;             // argv[0] is the program's path
  std::map<std::string, std::string> env;    // set or replaced in trainerd's environment
  std::string working_dir = "/";
  int fd3 = -1;                              // passed as fd 3 when >= 0
};

struct Child {
  pid_t pid = -1;      // also its process group id
  int output_fd = -1;  // read end of its stdout+stderr pipe, O_CLOEXEC; the caller closes it
};

// Starts the child. An exec failure (no such program, not executable) is
// reported by the child as "trainerd: cannot run PATH: why" on its output and
// exit status 127.
StatusOr<Child> SpawnChild(const ChildSpec& spec);

// "exited with status 1", "killed by signal 9 (SIGKILL)" for a waitpid status.
std::string DescribeWaitStatus(int wait_status);

}  // namespace trainerd::daemon
