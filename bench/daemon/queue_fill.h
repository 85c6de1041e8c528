// A job store that looks like a busy trainerd's: thousands of ended jobs
// with their progress, results and reasons, and the newest few still queued.
// Written through daemon::JobStore, the same calls trainerd makes, so the
// rows are exactly what a daemon that ran those jobs would have stored.
//
// Every spec is a real job of the tiny Llama test fixture (tests/fixtures/llama)
// on the CPU that trainerd-worker can run: the queued ones do run when the
// daemon starts (one at a time, on its one device), and never end by
// themselves (max_steps 1,000,000).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>

#include "common/status.h"

namespace trainerd::bench {

// The spec of one fixture job, about 1 KB of YAML as users write it: comments,
// and keys spelled out even where they equal the defaults.
struct FixtureJob {
  std::string name;
  std::string fixtures;    // the tests/fixtures folder, absolute
  std::string output_dir;  // absolute
  int64_t max_steps = 1000000;
  int64_t log_every = 10;
  int64_t lora_r = 8;
  double learning_rate = 1e-3;
  uint64_t seed = 42;
};

// The YAML text of `job`.
std::string FixtureJobYaml(const FixtureJob& job);

struct FillOptions {
  std::string state_dir;  // trainerd's --state-dir; must hold no queue.db yet
  std::string fixtures;   // tests/fixtures, absolute
  int64_t jobs = 10000;   // in all
  int64_t queued = 50;    // the newest jobs stay queued; the others have ended
  int64_t log_every = 10; // the queued jobs' training.log_every
  uid_t owner_uid = 0;    // owns the queued jobs (so it may cancel them); the others are spread over users
  uint64_t seed = 1;      // of the state mix, times and figures
};

struct FillResult {
  double prepare_seconds = 0;  // building the rows: YAML text, parsed again for spec_json
  double store_seconds = 0;    // the JobStore calls: one fsynced SQLite transaction each
  int64_t transactions = 0;    // JobStore calls made
  std::map<std::string, int64_t> jobs_by_state;  // "succeeded" → 8123, ...
  int64_t spec_yaml_bytes = 0;  // summed over the jobs
  int64_t queue_db_bytes = 0;   // queue.db (and any -wal) after the store is closed
};

// Creates <state_dir>/queue.db with `options.jobs` jobs, ids 1..jobs in
// submission order, and for each queued job its folder jobs/<id>/ with the
// job.yaml trainerd-worker is started on (as trainerd's submit writes it).
StatusOr<FillResult> FillQueue(const FillOptions& options);

}  // namespace trainerd::bench
