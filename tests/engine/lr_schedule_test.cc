// Expected values are worked out by hand from transformers' definitions
// (optimization.py, get_{constant,linear,cosine}_schedule_with_warmup):
//   warmup:   step < warmup:  step / max(1, warmup)
//   constant: 1
//   linear:   max(0, (total - step) / max(1, total - warmup))
//   cosine:   progress = (step - warmup) / max(1, total - warmup)
//             max(0, 0.5 * (1 + cos(pi * progress)))
#include "engine/lr_schedule.h"

#include <gtest/gtest.h>

namespace trainerd::engine {
namespace {

constexpr double kTol = 1e-12;

TEST(LrScheduleTest, ParsesTheThreeNames) {
  EXPECT_EQ(ParseLrSchedule("constant"), LrSchedule::kConstant);
  EXPECT_EQ(ParseLrSchedule("linear"), LrSchedule::kLinear);
  EXPECT_EQ(ParseLrSchedule("cosine"), LrSchedule::kCosine);
}

TEST(LrScheduleTest, ConstantWithoutWarmupIsOneThroughout) {
  for (int64_t step : {0, 1, 5, 9, 10}) {
    EXPECT_DOUBLE_EQ(LrMultiplier(LrSchedule::kConstant, step, 0, 10), 1.0) << "step " << step;
  }
}

TEST(LrScheduleTest, ConstantWithWarmupRisesThenHolds) {
  EXPECT_NEAR(LrMultiplier(LrSchedule::kConstant, 0, 4, 10), 0.0, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kConstant, 1, 4, 10), 0.25, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kConstant, 2, 4, 10), 0.5, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kConstant, 3, 4, 10), 0.75, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kConstant, 4, 4, 10), 1.0, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kConstant, 9, 4, 10), 1.0, kTol);
}

TEST(LrScheduleTest, LinearWithoutWarmupStartsAtOneAndFallsToZero) {
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 0, 0, 10), 1.0, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 1, 0, 10), 0.9, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 5, 0, 10), 0.5, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 9, 0, 10), 0.1, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 10, 0, 10), 0.0, kTol);
}

TEST(LrScheduleTest, LinearWithWarmup) {
  // warmup 3, total 12: decay over 9 steps.
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 0, 3, 12), 0.0, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 1, 3, 12), 1.0 / 3.0, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 2, 3, 12), 2.0 / 3.0, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 3, 3, 12), 1.0, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 5, 3, 12), 7.0 / 9.0, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 11, 3, 12), 1.0 / 9.0, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 12, 3, 12), 0.0, kTol);
}

TEST(LrScheduleTest, LinearNeverGoesNegativePastTheEnd) {
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 15, 3, 12), 0.0, kTol);
}

TEST(LrScheduleTest, CosineWithoutWarmup) {
  // total 10: progress = step / 10.
  EXPECT_NEAR(LrMultiplier(LrSchedule::kCosine, 0, 0, 10), 1.0, kTol);
  // 0.5 * (1 + cos(pi/5)), cos(pi/5) = (1 + sqrt 5) / 4 = 0.80901699437494742
  EXPECT_NEAR(LrMultiplier(LrSchedule::kCosine, 2, 0, 10), 0.90450849718747371, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kCosine, 5, 0, 10), 0.5, kTol);
  // 0.5 * (1 - cos(pi/5))
  EXPECT_NEAR(LrMultiplier(LrSchedule::kCosine, 8, 0, 10), 0.09549150281252629, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kCosine, 10, 0, 10), 0.0, kTol);
}

TEST(LrScheduleTest, CosineWithWarmup) {
  // warmup 2, total 10: progress = (step - 2) / 8.
  EXPECT_NEAR(LrMultiplier(LrSchedule::kCosine, 0, 2, 10), 0.0, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kCosine, 1, 2, 10), 0.5, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kCosine, 2, 2, 10), 1.0, kTol);
  // 0.5 * (1 + cos(pi/4)), cos(pi/4) = 0.70710678118654752
  EXPECT_NEAR(LrMultiplier(LrSchedule::kCosine, 4, 2, 10), 0.85355339059327376, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kCosine, 6, 2, 10), 0.5, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kCosine, 8, 2, 10), 0.14644660940672624, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kCosine, 10, 2, 10), 0.0, kTol);
}

TEST(LrScheduleTest, WarmupOfOneStepStartsAtZero) {
  // max(1, warmup) guards the division; step 0 of a 1-step warmup is 0/1.
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 0, 1, 5), 0.0, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 1, 1, 5), 1.0, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 2, 1, 5), 0.75, kTol);
}

TEST(LrScheduleTest, SingleStepRunUsesThePeakRate) {
  for (LrSchedule s : {LrSchedule::kConstant, LrSchedule::kLinear, LrSchedule::kCosine}) {
    EXPECT_NEAR(LrMultiplier(s, 0, 0, 1), 1.0, kTol);
  }
}

TEST(LrScheduleTest, WarmupLongerThanTheRunNeverReachesThePeak) {
  // warmup 10 of a 5-step run: steps 0..4 are all warmup, as in transformers.
  EXPECT_NEAR(LrMultiplier(LrSchedule::kLinear, 4, 10, 5), 0.4, kTol);
  EXPECT_NEAR(LrMultiplier(LrSchedule::kCosine, 4, 10, 5), 0.4, kTol);
}

}  // namespace
}  // namespace trainerd::engine
