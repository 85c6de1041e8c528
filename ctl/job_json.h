// The JSON trainctl prints (`list --json`, `status --json`): written field by
// field with explicit snake_case names, so that it stays the same when the
// protobuf changes shape (never protobuf's own JSON printer). docs/trainctl.md
// documents every field; keep the two in step. Adding a field is compatible;
// renaming or removing one is not.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "proto/trainerd.pb.h"

namespace trainerd::ctl {

// {"step", "total_steps", "epoch", "loss", "learning_rate", "grad_norm",
//  "tokens_per_second", "mfu", "peak_memory_bytes", "elapsed_seconds",
//  "eta_seconds", "eval_loss"}. NaN or infinite numbers become null.
nlohmann::ordered_json ProgressToJson(const proto::Progress& progress);

// {"exit_code", "signal", "output_path", "eval_loss"}.
nlohmann::ordered_json ResultToJson(const proto::JobResult& result);

// {"id", "name", "owner_uid", "owner", "state", "priority", "submitted_unix_ms",
//  "started_unix_ms", "finished_unix_ms", "attempt", "device", "output_dir",
//  "reason", "progress": {...}, "result": {...}} and, with `with_spec`,
// "spec": {"source", "base_dir", "yaml"}. Every key is always present (0 or ""
// when unset). `owner` is the owner's user name (the caller looks it up, e.g.
// UserName in ctl/format.h); `state` is JobStateName's lower-case name.
nlohmann::ordered_json JobToJson(const proto::Job& job, const std::string& owner, bool with_spec);

// `value` as text: indented by two spaces, invalid UTF-8 in strings replaced by
// U+FFFD (paths need not be UTF-8), with a final newline.
std::string DumpJson(const nlohmann::ordered_json& value);

}  // namespace trainerd::ctl
