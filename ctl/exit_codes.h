// trainctl's exit statuses: the one list, used by the commands, `trainctl
// --help`'s footer and the tests. docs/trainctl.md documents them for users;
// keep the three in step.
#pragma once

namespace trainerd::ctl {

// The command did what was asked (for wait and submit --wait/--follow: the job succeeded).
inline constexpr int kExitOk = 0;
// wait, submit --wait/--follow: the job ended without succeeding (failed,
// cancelled, or interrupted by trainerd's shutdown).
inline constexpr int kExitJobFailed = 1;
// The command line is wrong (unknown option, missing argument, unreadable FILE).
inline constexpr int kExitUsage = 2;
// trainerd could not be reached or did not answer properly: no socket, nobody
// listening, the connection lost mid-answer, a reply trainctl cannot read.
inline constexpr int kExitUnreachable = 3;
// Permission denied: by trainerd (not the job's owner or root) or on its socket.
inline constexpr int kExitPermissionDenied = 4;
// No such job.
inline constexpr int kExitNotFound = 5;
// trainerd rejected the request (an invalid spec, cancelling an ended job), or
// `validate` found the spec invalid.
inline constexpr int kExitRejected = 6;
// trainerd failed internally while answering.
inline constexpr int kExitInternal = 7;
// Interrupted by Ctrl-C (SIGINT), as a shell reports 128 + SIGINT.
inline constexpr int kExitInterrupted = 130;

}  // namespace trainerd::ctl
