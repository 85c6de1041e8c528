// Jobs as people read them: the `trainctl list` table and the `trainctl
// status` block. Text only, no printing (ctl/job_json.h is the machine form).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "proto/trainerd.pb.h"

namespace trainerd::ctl {

struct ViewOptions {
  // Now, in Unix milliseconds: what "3m ago" is measured from.
  int64_t now_unix_ms = 0;
  // Written for a terminal: relative times ("3m ago") in the table. Off a
  // terminal, times are local "YYYY-MM-DD HH:MM:SS".
  bool terminal = false;
  // ANSI colours (states, the header); only ever on a terminal.
  bool colour = false;
  // The name of a uid (ctl/format.h's UserName when empty).
  std::function<std::string(uint32_t)> user_name;
};

// The ANSI SGR parameters `list` and `status` colour a state with: queued
// yellow, running cyan, succeeded green, failed red, cancelled dim,
// interrupted magenta; "" for others.
std::string StateSgr(proto::JobState state);

// The `list` table: columns ID, NAME, STATE, OWNER, PRIORITY, PROGRESS
// (ProgressSummary), SUBMITTED, DEVICE ("-" when none), one row per job in the
// order given. ctl/table.h lays it out.
std::string RenderJobTable(const std::vector<proto::Job>& jobs, const ViewOptions& options);

// The `status` block: a first line "job 7 (NAME): STATE", then one "  label:
// value" line per field that has a value (owner, priority, device, attempt,
// the progress bar with step/total and epoch, loss, eval loss, learning rate,
// grad norm, tokens/s, MFU, peak GPU memory, elapsed, ETA while running, the
// submitted/started/finished times, output dir, output path, reason, how the
// worker exited when it failed, the spec's source), labels padded to one width.
std::string RenderJobStatus(const proto::Job& job, const ViewOptions& options);

}  // namespace trainerd::ctl
