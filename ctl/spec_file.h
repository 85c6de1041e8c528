// A job spec file as trainctl sends it to trainerd (`submit`) or checks it
// (`validate`): its text, its name as the user typed it, and the absolute
// folder its relative paths resolve against — the spec file's own folder, as
// `trainerd-worker run FILE` resolves them (common/job_spec.h, ParseJobSpecFile).
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"
#include "proto/trainerd.pb.h"

namespace trainerd::ctl {

// The largest spec file trainctl reads: a job spec is a short YAML file, and
// the request that carries it must fit a frame (common/framing.h).
inline constexpr size_t kMaxSpecFileBytes = 1 << 20;

// Reads `path` into a JobSpec{yaml, source = path as given, base_dir = the
// absolute, lexically normal folder of `path`}. Errors name the path: a
// folder, a file that cannot be read, one over kMaxSpecFileBytes.
StatusOr<proto::JobSpec> ReadSpecFile(const std::string& path);

}  // namespace trainerd::ctl
