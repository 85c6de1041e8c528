// A count in three significant figures for progress lines: 812, 8.1k, 1.23M
// (tokens per second, parameters). Header-only and dependency-free.
#pragma once

#include <cstdio>
#include <string>

namespace trainerd {

inline std::string ShortCount(double value) {
  char buf[32];
  if (value >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.2fM", value / 1e6);
  } else if (value >= 1e3) {
    std::snprintf(buf, sizeof(buf), "%.1fk", value / 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f", value);
  }
  return buf;
}

}  // namespace trainerd
