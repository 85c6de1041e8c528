// engine/environment_level.h: how the speed paths' environment switches read.
#include "engine/environment_level.h"

#include <cstdlib>

#include <gtest/gtest.h>

namespace trainerd {
namespace {

constexpr const char* kName = "TRAINERD_ENVIRONMENT_LEVEL_TEST";

int LevelOf(const char* value, int max_level) {
  if (value == nullptr) {
    unsetenv(kName);
  } else {
    setenv(kName, value, 1);
  }
  const int level = engine::EnvironmentLevel(kName, max_level);
  unsetenv(kName);
  return level;
}

TEST(EnvironmentLevel, UnsetIsAutomatic) { EXPECT_EQ(LevelOf(nullptr, 3), engine::kAutomaticLevel); }

TEST(EnvironmentLevel, DigitsUpToTheMaximumAreTheirLevel) {
  for (int level = 0; level <= 3; ++level) {
    const char digit[2] = {static_cast<char>('0' + level), '\0'};
    EXPECT_EQ(LevelOf(digit, 3), level) << digit;
  }
}

// Anything else switches off: a level over the maximum, words, signs, spaces,
// more than one digit, the empty string.
TEST(EnvironmentLevel, AnythingElseIsOff) {
  for (const char* value : {"4", "2", "on", "true", "-1", " 1", "1 ", "01", "11", ""}) {
    EXPECT_EQ(LevelOf(value, value[0] == '2' ? 1 : 3), 0) << "'" << value << "'";
  }
}

}  // namespace
}  // namespace trainerd
