#include "engine/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace trainerd::engine {

LrSchedule ParseLrSchedule(const std::string& name) {
  if (name == "constant") return LrSchedule::kConstant;
  if (name == "cosine") return LrSchedule::kCosine;
  return LrSchedule::kLinear;
}

double LrMultiplier(LrSchedule schedule, int64_t step, int64_t warmup_steps, int64_t total_steps) {
  if (step < warmup_steps) {
    return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
  }
  if (schedule == LrSchedule::kConstant) return 1.0;
  const double progress = static_cast<double>(step - warmup_steps) /
                          static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  if (schedule == LrSchedule::kLinear) return std::max(0.0, 1.0 - progress);
  return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
}

}  // namespace trainerd::engine
