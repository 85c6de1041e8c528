// JobRecord (daemon/job_store.h, plain structs) ↔ proto::Job: the one place
// the daemon converts between the store's rows and the wire.
#pragma once

#include "daemon/job_store.h"
#include "proto/trainerd.pb.h"

namespace trainerd::daemon {

// Everything the proto carries: the spec (yaml, source, base_dir) only when the
// record has it (JobStore::ListDetail::kWithoutSpec leaves it empty).
// JobRecord's spec_json, log_path and queue_pos have no proto field.
proto::Job JobToProto(const JobRecord& job);
// The same, filling *out (which may live on an arena).
void JobToProto(const JobRecord& job, proto::Job* out);

// The inverse, for the fields proto::Job has; JOB_STATE_UNSPECIFIED or an
// unknown state becomes kQueued.
JobRecord JobFromProto(const proto::Job& job);

}  // namespace trainerd::daemon
