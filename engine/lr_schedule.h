// Learning-rate schedules as transformers defines them
// (get_{constant,linear,cosine}_schedule_with_warmup). Torch-free.
#pragma once

#include <cstdint>
#include <string>

namespace trainerd::engine {

enum class LrSchedule { kConstant, kLinear, kCosine };

// "constant" | "linear" | "cosine"; the job spec has validated the name.
LrSchedule ParseLrSchedule(const std::string& name);

// The factor on the peak learning rate for the optimizer step with 0-based
// index `step` of `total_steps`: step/warmup during warmup, then 1 (constant),
// a straight line to 0 (linear) or half a cosine to 0 (cosine).
double LrMultiplier(LrSchedule schedule, int64_t step, int64_t warmup_steps, int64_t total_steps);

}  // namespace trainerd::engine
