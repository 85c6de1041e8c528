// The validation a job spec gets when it is submitted to trainerd, shared by
// the daemon (submit, validate requests) and trainctl (`trainctl validate`
// runs it locally, so both say the same thing about a spec).
//
// Parsing (common/job_spec.h) checks the spec's own rules; CheckSpecFiles adds
// what depends on the filesystem as the checker sees it.
#pragma once

#include <string>

#include "common/job_spec.h"
#include "common/status.h"

namespace trainerd {

// The checks the spec parser cannot make: model.path is a folder holding a
// readable config.json, data.train and data.eval (when set) are readable
// regular files. Each error names the spec's source, the key, the path and
// what to do; all of them come back, one a line.
Status CheckSpecFiles(const JobSpec& spec);

// Parses `yaml` as a job submitted to trainerd (output.dir optional: the
// daemon puts outputs in the job's folder when it is absent) and checks its
// files. `base_dir` must be absolute: the submitter's working folder, which
// relative paths in the spec resolve against. `source` names the spec in
// messages ("job.yaml" when empty).
StatusOr<JobSpec> ValidateSubmittedSpec(const std::string& yaml, const std::string& source,
                                        const std::string& base_dir, int64_t checkpoint_every = 0);

}  // namespace trainerd
