// Each job's log: the file <state_dir>/jobs/<id>/log and its live followers.
//
// While a job runs, its worker's output and trainerd's own notes about it
// ("started attempt 2 on cuda:0", "worker exited with status 1") are appended
// here line by line; `trainctl logs -f` followers get each line as it is
// written, and their streams end when the job's log is closed (the job ended).
// A follower first gets the file's tail and then the live lines: both happen
// on the io_context thread, so no line falls between the two.
//
// Threading: not thread-safe; the daemon's io_context thread makes every call.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "daemon/request_handler.h"

namespace trainerd::daemon {

// The last `tail` lines (0: all) of the log at `path`, reading at most its last
// kMaxLogTailBytes; no file is an empty log.
constexpr int64_t kMaxLogTailBytes = 8 << 20;
StatusOr<std::vector<std::string>> ReadLogTail(const std::string& path, int64_t tail);

class JobLogs {
 public:
  JobLogs() = default;
  ~JobLogs();  // closes the files; followers' streams are left to their sessions
  JobLogs(const JobLogs&) = delete;
  JobLogs& operator=(const JobLogs&) = delete;

  // Opens job `id`'s log at `path` for appending (creating it), e.g. when a
  // worker starts. Opening an open log again is fine.
  Status Open(int64_t id, const std::string& path);
  // Appends `line` (a '\n' is added) to the job's open log and sends it to its
  // followers. A write error is returned (the followers still get the line).
  Status Append(int64_t id, const std::string& line);
  // Closes the job's log (if open) and ends its followers' streams.
  void Close(int64_t id);

  // Streams `id`'s new lines to `writer` until Close (or the connection closes).
  void Follow(int64_t id, ReplyWriter writer);
  size_t follower_count(int64_t id) const;

 private:
  std::map<int64_t, int> files_;  // fd of each open log
  std::map<int64_t, std::list<ReplyWriter>> followers_;
};

}  // namespace trainerd::daemon
