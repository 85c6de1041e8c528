#include "common/error_lines.h"

#include <algorithm>
#include <cstdio>

namespace trainerd {

void PrintErrorLines(const std::string& prefix, const std::string& message) {
  size_t start = 0;
  do {
    const size_t end = std::min(message.find('\n', start), message.size());
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), message.substr(start, end - start).c_str());
    start = end + 1;
  } while (start < message.size());
}

}  // namespace trainerd
