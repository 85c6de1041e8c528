#include "common/log_setup.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace trainerd {
namespace {

// %N: the syslog priority of a message's level (LOG_DEBUG 7 ... LOG_CRIT 2).
class SyslogPriorityFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    char digit = '6';
    switch (msg.level) {
      case spdlog::level::trace:
      case spdlog::level::debug:
        digit = '7';
        break;
      case spdlog::level::info:
        digit = '6';
        break;
      case spdlog::level::warn:
        digit = '4';
        break;
      case spdlog::level::err:
        digit = '3';
        break;
      case spdlog::level::critical:
        digit = '2';
        break;
      default:
        break;
    }
    dest.push_back(digit);
  }
  std::unique_ptr<spdlog::custom_flag_formatter> clone() const override {
    return std::make_unique<SyslogPriorityFlag>();
  }
};

}  // namespace

bool StderrIsJournal(const std::function<const char*(const char*)>& getenv) {
  const char* stream = getenv("JOURNAL_STREAM");
  if (stream == nullptr || *stream == '\0') return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(stream, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st;
  if (fstat(STDERR_FILENO, &st) != 0) return false;
  return static_cast<unsigned long long>(st.st_dev) == dev && static_cast<unsigned long long>(st.st_ino) == ino;
}

std::string LogPattern(bool journald) { return journald ? "<%N>%v" : "%Y-%m-%d %H:%M:%S.%e %l %v"; }

void ApplyLogPattern(spdlog::logger& logger, bool journald) {
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<SyslogPriorityFlag>('N').set_pattern(LogPattern(journald));
  logger.set_formatter(std::move(formatter));
}

Status SetUpLogging(const std::string& level) {
  spdlog::level::level_enum parsed;
  if (level == "trace") {
    parsed = spdlog::level::trace;
  } else if (level == "debug") {
    parsed = spdlog::level::debug;
  } else if (level == "info") {
    parsed = spdlog::level::info;
  } else if (level == "warn") {
    parsed = spdlog::level::warn;
  } else if (level == "error") {
    parsed = spdlog::level::err;
  } else {
    return Status::Error("log level '" + level + "' is not one of trace, debug, info, warn, error");
  }
  auto logger = std::make_shared<spdlog::logger>("trainerd", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  ApplyLogPattern(*logger, StderrIsJournal([](const char* name) { return std::getenv(name); }));
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
  return Status::Ok();
}

std::string JobLogPrefix(int64_t job_id) { return "job " + std::to_string(job_id) + ": "; }

}  // namespace trainerd
