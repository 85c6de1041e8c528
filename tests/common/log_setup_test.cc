// Log lines under journald carry the syslog priority; elsewhere a timestamp
// and the level. Journald is detected from $JOURNAL_STREAM against stderr.
#include "common/log_setup.h"

#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

namespace trainerd {
namespace {

std::string Logged(bool journald, spdlog::level::level_enum level, const std::string& text) {
  std::ostringstream out;
  spdlog::logger logger("test", std::make_shared<spdlog::sinks::ostream_sink_st>(out));
  ApplyLogPattern(logger, journald);
  logger.set_level(spdlog::level::trace);
  logger.log(level, text);
  return out.str();
}

TEST(LogSetup, JournaldLinesStartWithTheSyslogPriority) {
  EXPECT_EQ(Logged(true, spdlog::level::info, "job 7: started"), "<6>job 7: started\n");
  EXPECT_EQ(Logged(true, spdlog::level::warn, "w"), "<4>w\n");
  EXPECT_EQ(Logged(true, spdlog::level::err, "e"), "<3>e\n");
  EXPECT_EQ(Logged(true, spdlog::level::critical, "c"), "<2>c\n");
  EXPECT_EQ(Logged(true, spdlog::level::debug, "d"), "<7>d\n");
}

TEST(LogSetup, TerminalLinesHaveTimeAndLevel) {
  const std::string line = Logged(false, spdlog::level::warn, "disk almost full");
  // "2026-12-02 13:00:00.123 warning disk almost full\n"
  ASSERT_GT(line.size(), 24u);
  EXPECT_EQ(line[4], '-');
  EXPECT_EQ(line[19], '.');
  EXPECT_NE(line.find(" warning disk almost full\n"), std::string::npos) << line;
  EXPECT_EQ(line.find('<'), std::string::npos);
}

TEST(LogSetup, JournalDetectedOnlyWhenJournalStreamNamesStderr) {
  struct stat st;
  ASSERT_EQ(fstat(STDERR_FILENO, &st), 0);
  const std::string match = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  const std::string other = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino + 1);
  auto env = [](const std::string& value) {
    return [value](const char* name) -> const char* {
      return std::string(name) == "JOURNAL_STREAM" ? value.c_str() : nullptr;
    };
  };
  EXPECT_TRUE(StderrIsJournal(env(match)));
  EXPECT_FALSE(StderrIsJournal(env(other)));
  EXPECT_FALSE(StderrIsJournal(env("garbage")));
  EXPECT_FALSE(StderrIsJournal([](const char*) -> const char* { return nullptr; }));
}

TEST(LogSetup, LevelsAreCheckedAndJobLinesPrefixed) {
  EXPECT_TRUE(SetUpLogging("debug").ok());
  Status bad = SetUpLogging("verbose");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("'verbose' is not one of trace, debug, info, warn, error"), std::string::npos);
  EXPECT_EQ(JobLogPrefix(7), "job 7: ");
}

}  // namespace
}  // namespace trainerd
