#include "ctl/format.h"

#include <pwd.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <vector>

namespace trainerd::ctl {
namespace {

// "%d%c %02d%c": a unit and the next smaller one, e.g. "3m 05s".
std::string TwoUnits(int64_t big, char big_unit, int64_t small, char small_unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%lld%c %02lld%c", static_cast<long long>(big), big_unit,
                static_cast<long long>(small), small_unit);
  return buf;
}

}  // namespace

std::string JobStateName(proto::JobState state) { return JobStateName(static_cast<int>(state)); }

std::string JobStateName(int state) {
  switch (state) {
    case proto::JOB_STATE_UNSPECIFIED:
      return "unspecified";
    case proto::JOB_STATE_QUEUED:
      return "queued";
    case proto::JOB_STATE_RUNNING:
      return "running";
    case proto::JOB_STATE_SUCCEEDED:
      return "succeeded";
    case proto::JOB_STATE_FAILED:
      return "failed";
    case proto::JOB_STATE_CANCELLED:
      return "cancelled";
    case proto::JOB_STATE_INTERRUPTED:
      return "interrupted";
    default:
      return "unknown";
  }
}

const std::vector<std::string>& JobStateNames() {
  static const std::vector<std::string> kNames = {"queued",    "running",   "succeeded",
                                                  "failed",    "cancelled", "interrupted"};
  return kNames;
}

std::optional<proto::JobState> ParseJobStateName(const std::string& name) {
  for (int s = proto::JOB_STATE_QUEUED; s <= proto::JOB_STATE_INTERRUPTED; ++s) {
    if (JobStateName(s) == name) return static_cast<proto::JobState>(s);
  }
  return std::nullopt;
}

bool IsEndedState(proto::JobState state) {
  return state == proto::JOB_STATE_SUCCEEDED || state == proto::JOB_STATE_FAILED ||
         state == proto::JOB_STATE_CANCELLED;
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  // Past ~292 billion years int64 overflows; nobody waits that long.
  const int64_t s = seconds >= 9.0e15 ? static_cast<int64_t>(9.0e15) : static_cast<int64_t>(seconds);
  if (s < 60) return std::to_string(s) + "s";
  if (s < 3600) return TwoUnits(s / 60, 'm', s % 60, 's');
  if (s < 86400) return TwoUnits(s / 3600, 'h', (s % 3600) / 60, 'm');
  return TwoUnits(s / 86400, 'd', (s % 86400) / 3600, 'h');
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 0) return "-";
  if (bytes < 1024) return std::to_string(bytes) + " B";
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  constexpr int kLast = static_cast<int>(sizeof kUnits / sizeof kUnits[0]) - 1;
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  // 1023.96 would print as "1024.0": move to the next unit at the rounding edge.
  while (value >= 1023.95 && unit < kLast) {
    value /= 1024.0;
    ++unit;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f %s", value, kUnits[unit]);
  return buf;
}

namespace {

// floor(100 * step / total) with step clamped to [0, total]; total > 0.
int64_t Percent(int64_t step, int64_t total) {
  step = std::clamp<int64_t>(step, 0, total);
  return static_cast<int64_t>(static_cast<long double>(step) * 100 / static_cast<long double>(total));
}

}  // namespace

std::string ProgressBar(int64_t step, int64_t total, int width) {
  if (total <= 0 || width < 0) return "";
  step = std::clamp<int64_t>(step, 0, total);
  const int64_t filled =
      static_cast<int64_t>(static_cast<long double>(step) * width / static_cast<long double>(total));
  std::string bar = "[";
  bar.append(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(width - filled), '-');
  bar += "] " + std::to_string(Percent(step, total)) + "%";
  return bar;
}

std::string ProgressSummary(int64_t step, int64_t total) {
  if (total <= 0) return step > 0 ? std::to_string(step) : "-";
  return std::to_string(step) + "/" + std::to_string(total) + " " + std::to_string(Percent(step, total)) + "%";
}

std::string FormatAgo(int64_t then_unix_ms, int64_t now_unix_ms) {
  if (then_unix_ms == 0) return "-";
  const int64_t s = (now_unix_ms - then_unix_ms) / 1000;
  if (s < 1) return "just now";
  if (s < 60) return std::to_string(s) + "s ago";
  if (s < 3600) return std::to_string(s / 60) + "m ago";
  if (s < 86400) return std::to_string(s / 3600) + "h ago";
  return std::to_string(s / 86400) + "d ago";
}

std::string FormatLocalTime(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  // Floor division, so times before 1970 round down like the rest.
  int64_t seconds = unix_ms / 1000;
  if (unix_ms % 1000 < 0) --seconds;
  const std::time_t t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  if (localtime_r(&t, &tm) == nullptr) return "-";
  char buf[64];
  if (std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm) == 0) return "-";
  return buf;
}

std::string FormatCount(int64_t value) {
  const bool negative = value < 0;
  // Digits of |value| without overflowing on INT64_MIN.
  uint64_t magnitude = negative ? ~static_cast<uint64_t>(value) + 1 : static_cast<uint64_t>(value);
  std::string digits = std::to_string(magnitude);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return negative ? "-" + out : out;
}

std::string FormatFixed(double value, int decimals) {
  if (!std::isfinite(value)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string FormatScientific(double value) {
  if (!std::isfinite(value)) return "-";
  if (value == 0) return "0";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2e", value);
  return buf;
}

std::string SignalName(int signal) {
  switch (signal) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGSYS:
      return "SIGSYS";
    default:
      return "signal " + std::to_string(signal);
  }
}

std::string UserName(uint32_t uid) {
  // One passwd lookup per uid per process: a table of thousands of jobs has a
  // few owners, and a lookup can cost milliseconds (nss-systemd, LDAP).
  static std::map<uint32_t, std::string> cache;
  auto cached = cache.find(uid);
  if (cached != cache.end()) return cached->second;
  std::vector<char> buf(16384);
  passwd entry{};
  passwd* found = nullptr;
  std::string name = std::to_string(uid);
  if (getpwuid_r(static_cast<uid_t>(uid), &entry, buf.data(), buf.size(), &found) == 0 && found != nullptr &&
      found->pw_name != nullptr && found->pw_name[0] != '\0') {
    name = found->pw_name;
  }
  cache.emplace(uid, name);
  return name;
}

}  // namespace trainerd::ctl
