// Error messages on stderr with a prefix on every line. A message may hold
// several errors, one a line (a job spec's, common/job_spec.h); each line then
// reads as an error of its own: "trainctl: error: job.yaml:7: ...".
#pragma once

#include <string>

namespace trainerd {

// Prints each line of `message` to stderr as prefix + line (one line for an
// empty message).
void PrintErrorLines(const std::string& prefix, const std::string& message);

}  // namespace trainerd
