// Latency samples (milliseconds) summarised as the benchmark reports them.
#pragma once

#include <cstddef>
#include <vector>

namespace trainerd::bench {

struct LatencySummary {
  size_t count = 0;
  double min = 0, p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0;  // ms
};

// Percentiles by nearest rank: pN is the smallest sample that at least N% of
// the samples do not exceed. All zero for no samples.
LatencySummary Summarize(std::vector<double> samples_ms);

}  // namespace trainerd::bench
