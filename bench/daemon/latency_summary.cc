#include "bench/daemon/latency_summary.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace trainerd::bench {

LatencySummary Summarize(std::vector<double> samples_ms) {
  LatencySummary s;
  s.count = samples_ms.size();
  if (samples_ms.empty()) return s;
  std::sort(samples_ms.begin(), samples_ms.end());
  auto rank = [&](double percent) {
    const double n = static_cast<double>(samples_ms.size());
    const size_t r = static_cast<size_t>(std::ceil(percent / 100.0 * n));
    return samples_ms[std::min(samples_ms.size(), std::max<size_t>(r, 1)) - 1];
  };
  s.min = samples_ms.front();
  s.p50 = rank(50);
  s.p90 = rank(90);
  s.p99 = rank(99);
  s.max = samples_ms.back();
  s.mean = std::accumulate(samples_ms.begin(), samples_ms.end(), 0.0) / static_cast<double>(samples_ms.size());
  return s;
}

}  // namespace trainerd::bench
