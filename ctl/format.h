// How trainctl writes figures for people: job states, durations, byte counts,
// progress bars, times and user names. Pure functions (UserName and
// FormatLocalTime read the passwd database and the time zone), no printing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "proto/trainerd.pb.h"

namespace trainerd::ctl {

// The lower-case name of a state: "queued", "running", "succeeded", "failed",
// "cancelled", "interrupted"; "unspecified" for JOB_STATE_UNSPECIFIED and
// "unknown" for a value this trainctl does not know. The names `list --state`
// takes and the JSON output's `state` values.
std::string JobStateName(proto::JobState state);
std::string JobStateName(int state);

// The state called `name` (one of JobStateNames()); nullopt for anything else.
std::optional<proto::JobState> ParseJobStateName(const std::string& name);

// The six states a job can be in, in the enum's order: "queued" ... "interrupted".
const std::vector<std::string>& JobStateNames();

// True for succeeded, failed and cancelled: the job will not run again.
bool IsEndedState(proto::JobState state);

// A duration in seconds, for people, rounded down: "0s", "59s", "1m 00s",
// "59m 59s", "1h 00m", "23h 59m", "1d 00h", "12d 03h". "-" for a negative,
// NaN or infinite value.
std::string FormatDuration(double seconds);

// A byte count in binary units with one decimal: "0 B", "1023 B", "1.0 KiB",
// "1.5 MiB", "12.3 GiB", "2.0 TiB", up to PiB; a value that would print as
// 1024.0 of a unit takes the next one. "-" for a negative count.
std::string FormatBytes(int64_t bytes);

// A text progress bar and percentage: "[#########-----------] 45%" for 450 of
// 1000 with width 20. `width` cells, of which floor(width * step / total) are
// '#' and the rest '-'; the percentage is floor(100 * step / total). `step` is
// clamped to [0, total]. Empty when total <= 0 (the total is unknown).
std::string ProgressBar(int64_t step, int64_t total, int width = 20);

// Step and total for a table cell: "450/1000 45%" (percentage as ProgressBar's);
// "450" when the total is unknown (<= 0) and step > 0; "-" when both are 0.
std::string ProgressSummary(int64_t step, int64_t total);

// How long before `now_unix_ms` the time `then_unix_ms` was, roughly: "just
// now" (under a second, or in the future), "45s ago", "3m ago", "5h ago",
// "12d ago" (each rounded down). "-" when then_unix_ms is 0 (never).
std::string FormatAgo(int64_t then_unix_ms, int64_t now_unix_ms);

// A time in the local time zone as "2024-05-01 14:03:07"; "-" for 0 (never).
std::string FormatLocalTime(int64_t unix_ms);

// An integer with thousands separated by commas: "12,345", "-1,000", "7".
std::string FormatCount(int64_t value);

// A number in a short fixed form: "%.*f" with `decimals` digits; "-" for NaN or infinity.
std::string FormatFixed(double value, int decimals);

// A learning rate (or another small number) in scientific form: "2.00e-04"; "0" for zero.
std::string FormatScientific(double value);

// The name of a signal: "SIGKILL" for 9, ...; "signal N" for one it does not know.
std::string SignalName(int signal);

// The user name of `uid` from the passwd database, or the uid as decimal text
// when it has no entry.
std::string UserName(uint32_t uid);

}  // namespace trainerd::ctl
