// The programs the benchmark runs: trainerd in the background, trainctl timed
// from spawn to exit. posix_spawn, with the benchmark's environment plus
// extra variables, stdin from /dev/null and stdout + stderr to one file.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace trainerd::bench {

// Starts `argv` (argv[0] a path) with `env` ("NAME=value", overriding the
// inherited ones) and its output appended to `output_path` ("/dev/null" to drop it).
StatusOr<pid_t> SpawnProgram(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                             const std::string& output_path);

// Waits for `pid` to exit; its wait status, or nullopt when `timeout` passed first
// (the child then still runs).
std::optional<int> WaitForExit(pid_t pid, std::chrono::milliseconds timeout);

// "exited with status 0", "was killed by signal 9 (SIGKILL)".
std::string DescribeWaitStatus(int status);

// CPU time (user + system) `pid` has used so far, in milliseconds (10 ms
// ticks); -1 when it cannot be read.
double ProcessCpuMs(pid_t pid);

}  // namespace trainerd::bench
