// trainctl's figures for people (ctl/format.h). Expectations follow the
// formats docs/trainctl.md promises, written by hand.
#include "ctl/format.h"

#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>

namespace trainerd::ctl {
namespace {

TEST(FormatDurationTest, SecondsUnderAMinute) {
  EXPECT_EQ(FormatDuration(0), "0s");
  EXPECT_EQ(FormatDuration(0.9), "0s");
  EXPECT_EQ(FormatDuration(45), "45s");
  EXPECT_EQ(FormatDuration(59.99), "59s");
}

TEST(FormatDurationTest, MinutesWithPaddedSeconds) {
  EXPECT_EQ(FormatDuration(60), "1m 00s");
  EXPECT_EQ(FormatDuration(185), "3m 05s");
  EXPECT_EQ(FormatDuration(3599), "59m 59s");
}

TEST(FormatDurationTest, HoursWithPaddedMinutes) {
  EXPECT_EQ(FormatDuration(3600), "1h 00m");
  EXPECT_EQ(FormatDuration(3720), "1h 02m");
  EXPECT_EQ(FormatDuration(3600 + 59), "1h 00m");  // rounded down
  EXPECT_EQ(FormatDuration(86399), "23h 59m");
}

TEST(FormatDurationTest, DaysWithPaddedHours) {
  EXPECT_EQ(FormatDuration(86400), "1d 00h");
  EXPECT_EQ(FormatDuration(12 * 86400 + 3 * 3600 + 59 * 60), "12d 03h");
}

TEST(FormatDurationTest, NegativeNanAndInfinityAreADash) {
  EXPECT_EQ(FormatDuration(-1), "-");
  EXPECT_EQ(FormatDuration(std::nan("")), "-");
  EXPECT_EQ(FormatDuration(std::numeric_limits<double>::infinity()), "-");
}

TEST(FormatBytesTest, BytesBelowOneKibibyte) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
}

TEST(FormatBytesTest, BinaryUnitsWithOneDecimal) {
  EXPECT_EQ(FormatBytes(1024), "1.0 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(3 * 1024 * 1024 / 2), "1.5 MiB");
  EXPECT_EQ(FormatBytes(static_cast<int64_t>(12.3 * 1024 * 1024 * 1024)), "12.3 GiB");
  EXPECT_EQ(FormatBytes(int64_t{2} << 40), "2.0 TiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 50), "3.0 PiB");
}

TEST(FormatBytesTest, AValueThatWouldRoundTo1024TakesTheNextUnit) {
  EXPECT_EQ(FormatBytes((1 << 20) - 1), "1.0 MiB");
  EXPECT_EQ(FormatBytes((int64_t{1} << 30) - 1), "1.0 GiB");
}

TEST(FormatBytesTest, NegativeIsADash) { EXPECT_EQ(FormatBytes(-1), "-"); }

TEST(ProgressBarTest, FilledCellsAndPercentRoundDown) {
  EXPECT_EQ(ProgressBar(450, 1000), "[#########-----------] 45%");
  EXPECT_EQ(ProgressBar(1, 3, 10), "[###-------] 33%");
  EXPECT_EQ(ProgressBar(999, 1000), "[###################-] 99%");
}

TEST(ProgressBarTest, EmptyAndFull) {
  EXPECT_EQ(ProgressBar(0, 100), "[--------------------] 0%");
  EXPECT_EQ(ProgressBar(100, 100), "[####################] 100%");
}

TEST(ProgressBarTest, StepIsClampedToTheTotal) {
  EXPECT_EQ(ProgressBar(150, 100), "[####################] 100%");
  EXPECT_EQ(ProgressBar(-5, 100), "[--------------------] 0%");
}

TEST(ProgressBarTest, UnknownTotalGivesNothing) {
  EXPECT_EQ(ProgressBar(5, 0), "");
  EXPECT_EQ(ProgressBar(5, -1), "");
}

TEST(ProgressBarTest, HugeStepCountsDoNotOverflow) {
  const int64_t big = std::numeric_limits<int64_t>::max() - 1;  // even: big / 2 is exactly half
  EXPECT_EQ(ProgressBar(big / 2, big, 10), "[#####-----] 50%");
  EXPECT_EQ(ProgressBar(big / 2 - 1, big, 10), "[####------] 49%");
}

TEST(ProgressSummaryTest, StepOfTotalAndPercent) {
  EXPECT_EQ(ProgressSummary(450, 1000), "450/1000 45%");
  EXPECT_EQ(ProgressSummary(0, 10), "0/10 0%");
  EXPECT_EQ(ProgressSummary(5, 0), "5");
  EXPECT_EQ(ProgressSummary(0, 0), "-");
}

TEST(FormatAgoTest, RoundsDownToTheLargestUnit) {
  const int64_t now = 1'000'000'000'000;
  EXPECT_EQ(FormatAgo(now - 500, now), "just now");
  EXPECT_EQ(FormatAgo(now + 60'000, now), "just now");  // a clock a little ahead
  EXPECT_EQ(FormatAgo(now - 45'000, now), "45s ago");
  EXPECT_EQ(FormatAgo(now - (3 * 60 + 59) * 1000, now), "3m ago");
  EXPECT_EQ(FormatAgo(now - 5 * 3600'000, now), "5h ago");
  EXPECT_EQ(FormatAgo(now - 12 * 86400'000LL, now), "12d ago");
}

TEST(FormatAgoTest, NeverIsADash) { EXPECT_EQ(FormatAgo(0, 1'000'000), "-"); }

// Runs with TZ=UTC so the expected local times are the UTC ones.
class LocalTimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tz = getenv("TZ");
    if (tz != nullptr) saved_tz_ = tz;
    had_tz_ = tz != nullptr;
    setenv("TZ", "UTC", 1);
    tzset();
  }
  void TearDown() override {
    if (had_tz_) {
      setenv("TZ", saved_tz_.c_str(), 1);
    } else {
      unsetenv("TZ");
    }
    tzset();
  }
  bool had_tz_ = false;
  std::string saved_tz_;
};

TEST_F(LocalTimeTest, DateAndTimeToTheSecond) {
  EXPECT_EQ(FormatLocalTime(1714572187000), "2024-05-01 14:03:07");
  EXPECT_EQ(FormatLocalTime(1714572187999), "2024-05-01 14:03:07");
}

TEST_F(LocalTimeTest, NeverIsADash) { EXPECT_EQ(FormatLocalTime(0), "-"); }

TEST(FormatCountTest, GroupsThousands) {
  EXPECT_EQ(FormatCount(0), "0");
  EXPECT_EQ(FormatCount(999), "999");
  EXPECT_EQ(FormatCount(1000), "1,000");
  EXPECT_EQ(FormatCount(12345), "12,345");
  EXPECT_EQ(FormatCount(1234567), "1,234,567");
  EXPECT_EQ(FormatCount(-1000), "-1,000");
  EXPECT_EQ(FormatCount(std::numeric_limits<int64_t>::min()), "-9,223,372,036,854,775,808");
}

TEST(FormatNumberTest, FixedAndScientific) {
  EXPECT_EQ(FormatFixed(1.23456, 4), "1.2346");
  EXPECT_EQ(FormatFixed(std::nan(""), 2), "-");
  EXPECT_EQ(FormatScientific(2e-4), "2.00e-04");
  EXPECT_EQ(FormatScientific(0), "0");
}

TEST(SignalNameTest, KnownAndUnknown) {
  EXPECT_EQ(SignalName(SIGKILL), "SIGKILL");
  EXPECT_EQ(SignalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(SignalName(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(SignalName(200), "signal 200");
}

TEST(JobStateNameTest, LowerCaseNamesRoundTrip) {
  EXPECT_EQ(JobStateName(proto::JOB_STATE_QUEUED), "queued");
  EXPECT_EQ(JobStateName(proto::JOB_STATE_RUNNING), "running");
  EXPECT_EQ(JobStateName(proto::JOB_STATE_SUCCEEDED), "succeeded");
  EXPECT_EQ(JobStateName(proto::JOB_STATE_FAILED), "failed");
  EXPECT_EQ(JobStateName(proto::JOB_STATE_CANCELLED), "cancelled");
  EXPECT_EQ(JobStateName(proto::JOB_STATE_INTERRUPTED), "interrupted");
  EXPECT_EQ(JobStateName(proto::JOB_STATE_UNSPECIFIED), "unspecified");
  EXPECT_EQ(JobStateName(42), "unknown");
  ASSERT_EQ(JobStateNames().size(), 6u);
  for (const std::string& name : JobStateNames()) {
    std::optional<proto::JobState> state = ParseJobStateName(name);
    ASSERT_TRUE(state.has_value()) << name;
    EXPECT_EQ(JobStateName(*state), name);
  }
  EXPECT_FALSE(ParseJobStateName("Queued").has_value());
  EXPECT_FALSE(ParseJobStateName("unspecified").has_value());
  EXPECT_FALSE(ParseJobStateName("").has_value());
}

TEST(JobStateNameTest, EndedStates) {
  EXPECT_TRUE(IsEndedState(proto::JOB_STATE_SUCCEEDED));
  EXPECT_TRUE(IsEndedState(proto::JOB_STATE_FAILED));
  EXPECT_TRUE(IsEndedState(proto::JOB_STATE_CANCELLED));
  EXPECT_FALSE(IsEndedState(proto::JOB_STATE_QUEUED));
  EXPECT_FALSE(IsEndedState(proto::JOB_STATE_RUNNING));
  EXPECT_FALSE(IsEndedState(proto::JOB_STATE_INTERRUPTED));
}

TEST(UserNameTest, PasswdNameOrTheUid) {
  const passwd* me = getpwuid(getuid());
  if (me != nullptr) {
    EXPECT_EQ(UserName(getuid()), me->pw_name);
  }
  // A uid with no passwd entry.
  uint32_t nobody_known = 3'999'999'999u;
  ASSERT_EQ(getpwuid(nobody_known), nullptr);
  EXPECT_EQ(UserName(nobody_known), "3999999999");
}

}  // namespace
}  // namespace trainerd::ctl
