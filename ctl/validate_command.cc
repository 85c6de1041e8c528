// trainctl validate FILE: the checks trainerd makes on submit, made here.
#include <cstdio>

#include "common/spec_check.h"
#include "ctl/commands.h"
#include "ctl/exit_codes.h"
#include "ctl/spec_file.h"

namespace trainerd::ctl {

int RunValidate(const CommandContext& /*context*/, const ValidateOptions& options) {
  StatusOr<proto::JobSpec> spec = ReadSpecFile(options.file);
  if (!spec.ok()) return ReportError(kExitUsage, spec.status().message());
  StatusOr<JobSpec> parsed = ValidateSubmittedSpec(spec->yaml(), spec->source(), spec->base_dir());
  if (!parsed.ok()) return ReportError(kExitRejected, parsed.status().message());
  std::printf("%s: ok\n", options.file.c_str());
  return kExitOk;
}

}  // namespace trainerd::ctl
