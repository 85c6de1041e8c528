// Logging for the programs (trainerd, trainctl): spdlog's default logger on
// stderr. Under journald each line starts with the syslog priority "<N>"
// (sd-daemon(3)), which journald turns into the entry's priority, and carries
// no timestamp of its own; on a terminal or file each line has a timestamp and
// the level. Library code does not log (it returns Status); programs do.
// Never include this from a translation unit that includes torch headers
// (spdlog; shared/gpu/README.md, trap 1).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <spdlog/logger.h>

#include "common/status.h"

namespace trainerd {

// Whether stderr is connected to the journal: $JOURNAL_STREAM ("DEV:INODE",
// set by systemd) names the device and inode of stderr. `getenv` is the
// environment lookup (tests pass their own).
bool StderrIsJournal(const std::function<const char*(const char*)>& getenv);

// The logger's line pattern: "<%N>%v" for journald (%N: the syslog priority of
// the level), else "%Y-%m-%d %H:%M:%S.%e %l %v".
std::string LogPattern(bool journald);

// Makes `logger` format with LogPattern(journald), including the %N flag.
void ApplyLogPattern(spdlog::logger& logger, bool journald);

// Sets the default logger: stderr, `level` one of trace, debug, info, warn,
// error (an error names the value and lists them), the journald pattern when
// stderr is the journal.
Status SetUpLogging(const std::string& level);

// "job 7: " — the prefix of every log line about a job.
std::string JobLogPrefix(int64_t job_id);

}  // namespace trainerd
