#include "daemon/job_store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "tests/temp_dir.h"

namespace trainerd::daemon {
namespace {

using testing::ExpectErrorContains;
using testing::TempDir;

// Runs SQL on the file through a connection of its own (not the store's).
void ExecRaw(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK) << path;
  char* error = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  EXPECT_EQ(rc, SQLITE_OK) << (error ? error : "") << "\n" << sql;
  sqlite3_free(error);
  sqlite3_close(db);
}

// The first column of the first row, as text ("" when there is none).
std::string QueryRaw(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK) << path;
  sqlite3_stmt* stmt = nullptr;
  std::string value;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  if (stmt && sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_text(stmt, 0)) {
    value = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

double MillisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

class JobStoreTest : public ::testing::Test {
 protected:
  std::string DbPath() const { return dir_ / "state/queue.db"; }

  JobStore OpenStore() {
    StatusOr<JobStore> store = JobStore::Open(DbPath());
    if (!store.ok()) ADD_FAILURE() << store.status().message();
    return std::move(store).value();
  }

  // A job as the server submits it.
  static JobRecord Submitted(const std::string& name, int32_t priority = 0) {
    JobRecord job;
    job.name = name;
    job.owner_uid = 1000;
    job.priority = priority;
    job.submitted_unix_ms = 1700000000000;
    job.spec_yaml = "model: {path: base}\n";
    job.spec_source = "/home/ana/" + name + ".yaml";
    job.spec_base_dir = "/home/ana";
    job.spec_json = "{\"model\":{\"path\":\"/home/ana/base\"}}";
    job.output_dir = "/home/ana/out/" + name;
    job.log_path = "/var/lib/trainerd/jobs/" + name + ".log";
    return job;
  }

  static int64_t AddOrDie(JobStore& store, const JobRecord& job) {
    StatusOr<int64_t> id = store.Add(job);
    EXPECT_TRUE(id.ok()) << id.status().message();
    return id.ok() ? *id : -1;
  }

  static JobRecord GetOrDie(JobStore& store, int64_t id) {
    StatusOr<std::optional<JobRecord>> job = store.Get(id);
    EXPECT_TRUE(job.ok()) << job.status().message();
    EXPECT_TRUE(job.ok() && job->has_value()) << "no job " << id;
    return job.ok() && job->has_value() ? **job : JobRecord();
  }

  static std::vector<int64_t> Ids(const std::vector<JobRecord>& jobs) {
    std::vector<int64_t> ids;
    for (const JobRecord& job : jobs) ids.push_back(job.id);
    return ids;
  }

  // The id NextQueued picks, 0 when nothing is queued.
  static int64_t NextId(JobStore& store) {
    StatusOr<std::optional<JobRecord>> next = store.NextQueued();
    EXPECT_TRUE(next.ok()) << next.status().message();
    return next.ok() && next->has_value() ? (*next)->id : 0;
  }

  TempDir dir_;
};

TEST_F(JobStoreTest, AddGetAndTheLifecycleRoundTripEveryField) {
  JobStore store = OpenStore();
  JobRecord submitted = Submitted("llama-lora", 5);
  submitted.spec_yaml = "model: {path: base}\n# ünïcode and a NUL: \0 end\n";
  submitted.spec_yaml.push_back('\0');
  submitted.owner_uid = 4000000000u;  // above INT32_MAX
  // Fields Add assigns or leaves empty, whatever the caller put there.
  submitted.id = 77;
  submitted.state = JobState::kFailed;
  submitted.attempt = 9;
  submitted.queue_pos = -5;
  submitted.started_unix_ms = 1;
  submitted.device = "cuda:7";
  submitted.progress.step = 3;
  submitted.result.exit_code = 1;
  submitted.reason = "stale";
  const int64_t id = AddOrDie(store, submitted);

  JobRecord expected = Submitted("llama-lora", 5);
  expected.spec_yaml = submitted.spec_yaml;
  expected.owner_uid = submitted.owner_uid;
  expected.id = id;
  expected.state = JobState::kQueued;
  expected.queue_pos = id;
  EXPECT_EQ(GetOrDie(store, id), expected);
  const JobRecord queued = GetOrDie(store, id);
  EXPECT_EQ(queued.spec_yaml, submitted.spec_yaml);
  EXPECT_EQ(queued.owner_uid, 4000000000u);
  EXPECT_EQ(queued.attempt, 0);
  EXPECT_EQ(queued.device, "");

  ASSERT_TRUE(store.MarkRunning(id, "cuda:0", 1700000001000).ok());
  JobProgress progress;
  progress.step = 120;
  progress.total_steps = 1000;
  progress.epoch = 0.25;
  progress.loss = 1.875;
  progress.learning_rate = 2e-4;
  progress.grad_norm = 0.5;
  progress.tokens_per_second = 12345.5;
  progress.mfu = 0.41;
  progress.peak_memory_bytes = int64_t{70} << 30;
  progress.elapsed_seconds = 600.5;
  progress.eta_seconds = 4400.25;
  progress.eval_loss = 1.9;
  ASSERT_TRUE(store.UpdateProgress(id, progress).ok());
  JobResult result;
  result.exit_code = 0;
  result.signal = 0;
  result.output_path = "/home/ana/out/llama-lora/adapter";
  result.eval_loss = 1.7;
  ASSERT_TRUE(store.Finish(id, JobState::kSucceeded, result, "done", 1700000009000).ok());

  expected.state = JobState::kSucceeded;
  expected.attempt = 1;
  expected.device = "cuda:0";
  expected.started_unix_ms = 1700000001000;
  expected.finished_unix_ms = 1700000009000;
  expected.progress = progress;
  expected.result = result;
  expected.reason = "done";
  const JobRecord done = GetOrDie(store, id);
  EXPECT_EQ(done, expected);
  EXPECT_EQ(done.progress.peak_memory_bytes, int64_t{70} << 30);
  EXPECT_EQ(done.progress.learning_rate, 2e-4);
  EXPECT_EQ(done.result.output_path, "/home/ana/out/llama-lora/adapter");
}

TEST_F(JobStoreTest, ProgressKeepsNanAndInfinity) {
  JobStore store = OpenStore();
  const int64_t id = AddOrDie(store, Submitted("diverged"));
  ASSERT_TRUE(store.MarkRunning(id, "cpu", 1).ok());
  JobProgress progress;
  progress.loss = std::numeric_limits<double>::quiet_NaN();
  progress.grad_norm = std::numeric_limits<double>::infinity();
  progress.eval_loss = -std::numeric_limits<double>::infinity();
  ASSERT_TRUE(store.UpdateProgress(id, progress).ok());
  const JobRecord job = GetOrDie(store, id);
  EXPECT_TRUE(std::isnan(job.progress.loss));
  EXPECT_EQ(job.progress.grad_norm, std::numeric_limits<double>::infinity());
  EXPECT_EQ(job.progress.eval_loss, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(job.progress.epoch, 0.0);
}

TEST_F(JobStoreTest, IdsIncreaseFromOne) {
  JobStore store = OpenStore();
  EXPECT_EQ(AddOrDie(store, Submitted("a")), 1);
  EXPECT_EQ(AddOrDie(store, Submitted("b")), 2);
  EXPECT_EQ(AddOrDie(store, Submitted("c")), 3);
  EXPECT_LT(GetOrDie(store, 2).queue_pos, GetOrDie(store, 3).queue_pos);
}

TEST_F(JobStoreTest, GetOfAnUnknownIdIsEmpty) {
  JobStore store = OpenStore();
  StatusOr<std::optional<JobRecord>> job = store.Get(42);
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_FALSE(job->has_value());
}

TEST_F(JobStoreTest, NextQueuedTakesTheHighestPriorityThenFifo) {
  JobStore store = OpenStore();
  EXPECT_EQ(NextId(store), 0);
  const int64_t low1 = AddOrDie(store, Submitted("low1", -1));
  const int64_t mid1 = AddOrDie(store, Submitted("mid1", 0));
  const int64_t high1 = AddOrDie(store, Submitted("high1", 10));
  const int64_t mid2 = AddOrDie(store, Submitted("mid2", 0));
  const int64_t high2 = AddOrDie(store, Submitted("high2", 10));
  std::vector<int64_t> order;
  for (int64_t id; (id = NextId(store)) != 0;) {
    order.push_back(id);
    ASSERT_TRUE(store.MarkRunning(id, "cpu", 1).ok());
  }
  EXPECT_EQ(order, (std::vector<int64_t>{high1, high2, mid1, mid2, low1}));
}

TEST_F(JobStoreTest, CancelEndsAQueuedJob) {
  JobStore store = OpenStore();
  const int64_t first = AddOrDie(store, Submitted("first"));
  const int64_t second = AddOrDie(store, Submitted("second"));
  ASSERT_TRUE(store.Cancel(first, "cancelled by uid 1000", 1700000005000).ok());
  const JobRecord job = GetOrDie(store, first);
  EXPECT_EQ(job.state, JobState::kCancelled);
  EXPECT_EQ(job.reason, "cancelled by uid 1000");
  EXPECT_EQ(job.finished_unix_ms, 1700000005000);
  EXPECT_EQ(job.attempt, 0);
  EXPECT_EQ(NextId(store), second);
}

TEST_F(JobStoreTest, CancelRefusesRunningEndedAndUnknownJobs) {
  JobStore store = OpenStore();
  const int64_t id = AddOrDie(store, Submitted("busy"));
  ASSERT_TRUE(store.MarkRunning(id, "cuda:0", 1).ok());
  ExpectErrorContains(store.Cancel(id, "no", 2),
                      {"job store " + DbPath(), "cancel job 1", "job 1 is running, not queued or interrupted"});
  ASSERT_TRUE(store.Finish(id, JobState::kFailed, JobResult{}, "boom", 3).ok());
  ExpectErrorContains(store.Cancel(id, "no", 4), {"job 1 is failed"});
  ExpectErrorContains(store.Cancel(99, "no", 4), {"cancel job 99", "no job 99"});
  EXPECT_EQ(GetOrDie(store, id).reason, "boom");
}

TEST_F(JobStoreTest, FinishRecordsTheEndStateAndResult) {
  JobStore store = OpenStore();
  const int64_t id = AddOrDie(store, Submitted("crashes"));
  ASSERT_TRUE(store.MarkRunning(id, "cuda:1", 10).ok());
  JobResult result;
  result.exit_code = -1;
  result.signal = 9;
  ASSERT_TRUE(store.Finish(id, JobState::kFailed, result, "the worker was killed by SIGKILL", 20).ok());
  const JobRecord job = GetOrDie(store, id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.result, result);
  EXPECT_EQ(job.reason, "the worker was killed by SIGKILL");
  EXPECT_EQ(job.finished_unix_ms, 20);
  EXPECT_EQ(job.device, "cuda:1");
  EXPECT_EQ(NextId(store), 0);
}

TEST_F(JobStoreTest, FinishRefusesAJobThatIsNotRunningAndANonEndState) {
  JobStore store = OpenStore();
  const int64_t id = AddOrDie(store, Submitted("waiting"));
  ExpectErrorContains(store.Finish(id, JobState::kSucceeded, JobResult{}, "", 1),
                      {"finish job 1 as succeeded", "job 1 is queued, not running"});
  ASSERT_TRUE(store.MarkRunning(id, "cpu", 1).ok());
  ExpectErrorContains(store.Finish(id, JobState::kQueued, JobResult{}, "", 1),
                      {"finish job 1 as queued", "succeeded, failed, cancelled or interrupted"});
  EXPECT_EQ(GetOrDie(store, id).state, JobState::kRunning);
}

TEST_F(JobStoreTest, MarkRunningAndUpdateProgressCheckTheState) {
  JobStore store = OpenStore();
  const int64_t id = AddOrDie(store, Submitted("job"));
  ExpectErrorContains(store.UpdateProgress(id, JobProgress{}), {"job 1 is queued, not running"});
  ASSERT_TRUE(store.MarkRunning(id, "cpu", 1).ok());
  ExpectErrorContains(store.MarkRunning(id, "cpu", 2), {"mark job 1 running", "job 1 is running, not queued"});
  ExpectErrorContains(store.MarkRunning(7, "cpu", 2), {"no job 7"});
  EXPECT_EQ(GetOrDie(store, id).attempt, 1);
  EXPECT_EQ(GetOrDie(store, id).started_unix_ms, 1);
}

TEST_F(JobStoreTest, SetPathsChangesOutputDirAndLogPath) {
  JobStore store = OpenStore();
  const int64_t id = AddOrDie(store, Submitted("job"));
  ASSERT_TRUE(store.SetPaths(id, "/out/1", "/var/lib/trainerd/jobs/1/log").ok());
  EXPECT_EQ(GetOrDie(store, id).output_dir, "/out/1");
  EXPECT_EQ(GetOrDie(store, id).log_path, "/var/lib/trainerd/jobs/1/log");
  ExpectErrorContains(store.SetPaths(5, "", ""), {"no job 5"});
}

TEST_F(JobStoreTest, ListSelectsActiveAllOrTheGivenStates) {
  JobStore store = OpenStore();
  const int64_t queued = AddOrDie(store, Submitted("queued"));
  const int64_t running = AddOrDie(store, Submitted("running"));
  const int64_t done = AddOrDie(store, Submitted("done"));
  const int64_t cancelled = AddOrDie(store, Submitted("cancelled"));
  const int64_t interrupted = AddOrDie(store, Submitted("interrupted"));
  for (int64_t id : {running, done, interrupted}) ASSERT_TRUE(store.MarkRunning(id, "cpu", 1).ok());
  ASSERT_TRUE(store.Finish(done, JobState::kSucceeded, JobResult{}, "", 2).ok());
  ASSERT_TRUE(store.Finish(interrupted, JobState::kInterrupted, JobResult{}, "trainerd stopped", 2).ok());
  ASSERT_TRUE(store.Cancel(cancelled, "by owner", 2).ok());

  StatusOr<std::vector<JobRecord>> active = store.List(false, {});
  ASSERT_TRUE(active.ok()) << active.status().message();
  EXPECT_EQ(Ids(*active), (std::vector<int64_t>{queued, running, interrupted}));
  StatusOr<std::vector<JobRecord>> all = store.List(true, {});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(Ids(*all), (std::vector<int64_t>{queued, running, done, cancelled, interrupted}));
  StatusOr<std::vector<JobRecord>> ended = store.List(false, {JobState::kSucceeded, JobState::kCancelled});
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ(Ids(*ended), (std::vector<int64_t>{done, cancelled}));
  EXPECT_EQ((*ended)[1], GetOrDie(store, cancelled));
}

TEST_F(JobStoreTest, RecoverAfterRestartPutsRunningAndInterruptedJobsAtTheHead) {
  JobStore store = OpenStore();
  const int64_t a = AddOrDie(store, Submitted("a"));  // ends
  const int64_t b = AddOrDie(store, Submitted("b"));  // interrupted by a shutdown
  const int64_t c = AddOrDie(store, Submitted("c"));  // left running (trainerd was killed)
  const int64_t d = AddOrDie(store, Submitted("d"));  // queued
  const int64_t e = AddOrDie(store, Submitted("e"));  // queued
  for (int64_t id : {a, b, c}) ASSERT_TRUE(store.MarkRunning(id, "cuda:0", 100).ok());
  ASSERT_TRUE(store.Finish(a, JobState::kSucceeded, JobResult{}, "", 200).ok());
  ASSERT_TRUE(store.Finish(b, JobState::kInterrupted, JobResult{0, 15, "", 0}, "trainerd stopped", 300).ok());
  StatusOr<std::vector<JobRecord>> before = store.List(true, {});
  ASSERT_TRUE(before.ok());

  StatusOr<std::vector<int64_t>> recovered = store.RecoverAfterRestart();
  ASSERT_TRUE(recovered.ok()) << recovered.status().message();
  EXPECT_EQ(*recovered, (std::vector<int64_t>{b, c}));

  for (int64_t id : {b, c}) {
    const JobRecord job = GetOrDie(store, id);
    EXPECT_EQ(job.state, JobState::kQueued);
    EXPECT_EQ(job.reason, "interrupted; resumes from its last checkpoint");
    EXPECT_EQ(job.attempt, 1);
    EXPECT_LT(job.queue_pos, GetOrDie(store, d).queue_pos);
  }
  EXPECT_LT(GetOrDie(store, b).queue_pos, GetOrDie(store, c).queue_pos);
  // Nothing else moved or changed.
  for (const JobRecord& job : *before) {
    if (job.id != b && job.id != c) {
      EXPECT_EQ(GetOrDie(store, job.id), job) << "job " << job.id;
    }
  }
  std::vector<int64_t> order;
  for (int64_t id; (id = NextId(store)) != 0;) {
    order.push_back(id);
    ASSERT_TRUE(store.MarkRunning(id, "cpu", 400).ok());
  }
  EXPECT_EQ(order, (std::vector<int64_t>{b, c, d, e}));
  EXPECT_EQ(GetOrDie(store, b).attempt, 2);
  EXPECT_EQ(GetOrDie(store, b).reason, "");
}

TEST_F(JobStoreTest, RecoverAfterRestartAgainGoesBelowTheFirstRecovered) {
  JobStore store = OpenStore();
  const int64_t a = AddOrDie(store, Submitted("a"));
  const int64_t b = AddOrDie(store, Submitted("b"));
  ASSERT_TRUE(store.MarkRunning(b, "cpu", 1).ok());
  ASSERT_TRUE(store.RecoverAfterRestart().ok());  // b before a
  ASSERT_TRUE(store.MarkRunning(a, "cpu", 1).ok());
  StatusOr<std::vector<int64_t>> again = store.RecoverAfterRestart();  // now a before b
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, (std::vector<int64_t>{a}));
  EXPECT_EQ(NextId(store), a);
}

TEST_F(JobStoreTest, RecoverAfterRestartWithNothingToRecoverChangesNothing) {
  JobStore store = OpenStore();
  AddOrDie(store, Submitted("a"));
  StatusOr<std::vector<JobRecord>> before = store.List(true, {});
  StatusOr<std::vector<int64_t>> recovered = store.RecoverAfterRestart();
  ASSERT_TRUE(recovered.ok()) << recovered.status().message();
  EXPECT_TRUE(recovered->empty());
  StatusOr<std::vector<JobRecord>> after = store.List(true, {});
  EXPECT_EQ(*after, *before);
}

TEST_F(JobStoreTest, ReopenKeepsEverything) {
  std::vector<JobRecord> before;
  {
    JobStore store = OpenStore();
    for (int i = 0; i < 4; ++i) AddOrDie(store, Submitted("job" + std::to_string(i), i % 2));
    ASSERT_TRUE(store.MarkRunning(2, "cuda:0", 5).ok());
    JobProgress progress;
    progress.step = 7;
    progress.loss = 2.5;
    ASSERT_TRUE(store.UpdateProgress(2, progress).ok());
    ASSERT_TRUE(store.Cancel(3, "by root", 6).ok());
    before = *store.List(true, {});
  }
  JobStore store = OpenStore();
  StatusOr<std::vector<JobRecord>> after = store.List(true, {});
  ASSERT_TRUE(after.ok()) << after.status().message();
  EXPECT_EQ(*after, before);
  EXPECT_EQ(AddOrDie(store, Submitted("next")), 5);
}

TEST_F(JobStoreTest, JobsSurviveAProcessThatExitsWithoutClosing) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Like trainerd killed mid-flight: no destructor, no close, no checkpoint of the WAL.
    StatusOr<JobStore> store = JobStore::Open(DbPath());
    if (!store.ok()) _exit(10);
    for (int i = 0; i < 3; ++i) {
      if (!store->Add(Submitted("crash" + std::to_string(i))).ok()) _exit(11);
    }
    if (!store->MarkRunning(2, "cuda:0", 9).ok()) _exit(12);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  // The changes are still only in the write-ahead log.
  EXPECT_GT(std::filesystem::file_size(DbPath() + "-wal"), 0u);

  JobStore store = OpenStore();
  StatusOr<std::vector<JobRecord>> jobs = store.List(true, {});
  ASSERT_TRUE(jobs.ok()) << jobs.status().message();
  EXPECT_EQ(Ids(*jobs), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ((*jobs)[1].state, JobState::kRunning);
  StatusOr<std::vector<int64_t>> recovered = store.RecoverAfterRestart();
  ASSERT_TRUE(recovered.ok());
  EXPECT_EQ(*recovered, (std::vector<int64_t>{2}));
  EXPECT_EQ(NextId(store), 2);
}

TEST_F(JobStoreTest, WalAndSynchronousFullAreReallySet) {
  JobStore store = OpenStore();
  EXPECT_EQ(*store.PragmaValue("journal_mode"), "wal");
  EXPECT_EQ(*store.PragmaValue("synchronous"), "2");  // FULL
  EXPECT_EQ(*store.PragmaValue("foreign_keys"), "1");
  EXPECT_GT(std::stoi(*store.PragmaValue("busy_timeout")), 0);
  // WAL is a property of the file: another connection sees it too.
  EXPECT_EQ(QueryRaw(DbPath(), "PRAGMA journal_mode"), "wal");
  ExpectErrorContains(store.PragmaValue("x; DROP TABLE jobs").status(), {"not a pragma name"});
}

TEST_F(JobStoreTest, OpenCreatesTheFileAndItsFolders) {
  ASSERT_FALSE(std::filesystem::exists(dir_ / "state"));
  JobStore store = OpenStore();
  EXPECT_TRUE(std::filesystem::is_regular_file(DbPath()));
  EXPECT_EQ(store.path(), DbPath());
  EXPECT_EQ(QueryRaw(DbPath(), "SELECT version FROM schema_version"), std::to_string(JobStore::kSchemaVersion));
}

TEST_F(JobStoreTest, MovedStoreKeepsItsConnection) {
  JobStore first = OpenStore();
  const int64_t id = AddOrDie(first, Submitted("a"));
  JobStore second = std::move(first);
  EXPECT_EQ(GetOrDie(second, id).name, "a");
  JobStore third = OpenStore();
  third = std::move(second);
  EXPECT_EQ(AddOrDie(third, Submitted("b")), id + 1);
}

// Schema v1 exactly as migration 1 wrote it; frozen here on purpose.
constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version (version) VALUES (1);
CREATE TABLE jobs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  owner_uid INTEGER NOT NULL,
  state TEXT NOT NULL CHECK (state IN
      ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'interrupted')),
  priority INTEGER NOT NULL,
  queue_pos INTEGER NOT NULL,
  submitted_unix_ms INTEGER NOT NULL,
  started_unix_ms INTEGER NOT NULL DEFAULT 0,
  finished_unix_ms INTEGER NOT NULL DEFAULT 0,
  attempt INTEGER NOT NULL DEFAULT 0,
  spec_yaml TEXT NOT NULL,
  spec_source TEXT NOT NULL,
  spec_base_dir TEXT NOT NULL,
  spec_json TEXT NOT NULL,
  output_dir TEXT NOT NULL DEFAULT '',
  log_path TEXT NOT NULL DEFAULT '',
  device TEXT NOT NULL DEFAULT '',
  progress_step INTEGER NOT NULL DEFAULT 0,
  progress_total_steps INTEGER NOT NULL DEFAULT 0,
  progress_epoch REAL DEFAULT 0,
  progress_loss REAL DEFAULT 0,
  progress_learning_rate REAL DEFAULT 0,
  progress_grad_norm REAL DEFAULT 0,
  progress_tokens_per_second REAL DEFAULT 0,
  progress_mfu REAL DEFAULT 0,
  progress_peak_memory_bytes INTEGER NOT NULL DEFAULT 0,
  progress_elapsed_seconds REAL DEFAULT 0,
  progress_eta_seconds REAL DEFAULT 0,
  progress_eval_loss REAL DEFAULT 0,
  result_exit_code INTEGER NOT NULL DEFAULT 0,
  result_signal INTEGER NOT NULL DEFAULT 0,
  result_output_path TEXT NOT NULL DEFAULT '',
  result_eval_loss REAL DEFAULT 0,
  reason TEXT NOT NULL DEFAULT ''
);
INSERT INTO jobs (name, owner_uid, state, priority, queue_pos, submitted_unix_ms, attempt, spec_yaml,
                  spec_source, spec_base_dir, spec_json, device, progress_step)
  VALUES ('old', 1000, 'running', 3, 1, 1600000000000, 1, 'model: {path: m}', '/j.yaml', '/', '{}',
          'cuda:0', 40);
)sql";

TEST_F(JobStoreTest, MigratesAVersion1File) {
  std::filesystem::create_directories(dir_ / "state");
  ExecRaw(DbPath(), kSchemaV1);
  ASSERT_EQ(QueryRaw(DbPath(), "SELECT count(*) FROM sqlite_master WHERE name = 'jobs_by_queue_order'"), "0");
  {
    JobStore store = OpenStore();
    const JobRecord old = GetOrDie(store, 1);
    EXPECT_EQ(old.name, "old");
    EXPECT_EQ(old.state, JobState::kRunning);
    EXPECT_EQ(old.progress.step, 40);
    EXPECT_EQ(old.device, "cuda:0");
    EXPECT_EQ(AddOrDie(store, Submitted("new", 9)), 2);
    ASSERT_TRUE(store.RecoverAfterRestart().ok());
    EXPECT_EQ(NextId(store), 2);  // priority 9 over 3
  }
  EXPECT_EQ(QueryRaw(DbPath(), "SELECT version FROM schema_version"), "2");
  EXPECT_EQ(QueryRaw(DbPath(), "SELECT count(*) FROM sqlite_master WHERE name = 'jobs_by_queue_order'"), "1");
  // Opening a current file again migrates nothing.
  JobStore store = OpenStore();
  EXPECT_EQ(GetOrDie(store, 1).name, "old");
}

TEST_F(JobStoreTest, RefusesAFileFromANewerTrainerd) {
  { JobStore store = OpenStore(); }
  const std::string newer = std::to_string(JobStore::kSchemaVersion + 1);
  ExecRaw(DbPath(), "UPDATE schema_version SET version = " + newer);
  StatusOr<JobStore> store = JobStore::Open(DbPath());
  ASSERT_FALSE(store.ok());
  ExpectErrorContains(store.status(), {"job store " + DbPath(), "schema version " + newer,
                                       "newer than this trainerd supports (" +
                                           std::to_string(JobStore::kSchemaVersion) + ")",
                                       "not downgraded"});
  EXPECT_EQ(QueryRaw(DbPath(), "SELECT version FROM schema_version"), newer);
}

TEST_F(JobStoreTest, RefusesAFileThatIsNotSqliteNamingIt) {
  std::filesystem::create_directories(dir_ / "state");
  {
    std::ofstream garbage(DbPath(), std::ios::binary);
    for (int i = 0; i < 512; ++i) garbage << "this is not a database, just some text. ";
  }
  const auto size = std::filesystem::file_size(DbPath());
  StatusOr<JobStore> store = JobStore::Open(DbPath());
  ASSERT_FALSE(store.ok());
  ExpectErrorContains(store.status(), {"job store " + DbPath(), "not a SQLite database", "move the file aside"});
  EXPECT_EQ(std::filesystem::file_size(DbPath()), size);
}

TEST_F(JobStoreTest, RefusesASqliteFileThatIsNotAJobStore) {
  std::filesystem::create_directories(dir_ / "state");
  ExecRaw(DbPath(), "CREATE TABLE photos (id INTEGER PRIMARY KEY, data BLOB)");
  StatusOr<JobStore> store = JobStore::Open(DbPath());
  ASSERT_FALSE(store.ok());
  ExpectErrorContains(store.status(), {"job store " + DbPath(), "not a trainerd job store"});
  EXPECT_EQ(QueryRaw(DbPath(), "SELECT count(*) FROM sqlite_master"), "1");
}

TEST_F(JobStoreTest, TenThousandJobsListAndGetQuickly) {
  constexpr int kJobs = 10000;
  constexpr int kAddedOneByOne = 200;  // each Add is one fsynced commit (ms each on a disk)
  JobStore store = OpenStore();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kAddedOneByOne; ++i) {
    JobRecord job = Submitted("job" + std::to_string(i), i % 3);
    job.spec_yaml.append(1500, '#');  // about a real spec's size
    job.spec_json.append(1500, ' ');
    ASSERT_EQ(AddOrDie(store, job), i + 1);
  }
  const double add_ms = MillisecondsSince(start);
  // The rest in one transaction, through a second connection: copies of the
  // first jobs with the same id / queue_pos / priority pattern.
  ExecRaw(DbPath(), "BEGIN; WITH RECURSIVE n(i) AS (SELECT " + std::to_string(kAddedOneByOne) +
                        " UNION ALL SELECT i + 1 FROM n WHERE i + 1 < " + std::to_string(kJobs) +
                        ") INSERT INTO jobs (name, owner_uid, state, priority, queue_pos, submitted_unix_ms, "
                        "spec_yaml, spec_source, spec_base_dir, spec_json, output_dir, log_path) "
                        "SELECT 'job' || i, j.owner_uid, 'queued', i % 3, i + 1, j.submitted_unix_ms, j.spec_yaml, "
                        "j.spec_source, j.spec_base_dir, j.spec_json, j.output_dir, j.log_path "
                        "FROM n, jobs AS j WHERE j.id = 1; "
                        "UPDATE jobs SET state = 'succeeded', attempt = 1 WHERE id % 2 = 1; COMMIT;");

  start = std::chrono::steady_clock::now();
  StatusOr<std::vector<JobRecord>> all = store.List(true, {});
  const double list_all_ms = MillisecondsSince(start);
  ASSERT_TRUE(all.ok()) << all.status().message();
  ASSERT_EQ(all->size(), static_cast<size_t>(kJobs));
  EXPECT_EQ(all->back().id, kJobs);
  EXPECT_EQ(all->back().spec_yaml, (*all)[0].spec_yaml);

  start = std::chrono::steady_clock::now();
  StatusOr<std::vector<JobRecord>> summaries = store.List(true, {}, JobStore::ListDetail::kWithoutSpec);
  const double list_summaries_ms = MillisecondsSince(start);
  ASSERT_TRUE(summaries.ok()) << summaries.status().message();
  ASSERT_EQ(summaries->size(), static_cast<size_t>(kJobs));
  for (size_t i = 0; i < summaries->size(); ++i) {
    JobRecord full = (*all)[i];
    full.spec_yaml.clear();
    full.spec_json.clear();
    ASSERT_EQ((*summaries)[i], full) << "job " << full.id;
  }

  start = std::chrono::steady_clock::now();
  StatusOr<std::vector<JobRecord>> active = store.List(false, {});
  const double list_active_ms = MillisecondsSince(start);
  ASSERT_TRUE(active.ok());
  EXPECT_EQ(active->size(), static_cast<size_t>(kJobs / 2));

  start = std::chrono::steady_clock::now();
  for (int64_t id = 1; id <= kJobs; ++id) ASSERT_EQ(GetOrDie(store, id).id, id);
  const double get_all_ms = MillisecondsSince(start);

  start = std::chrono::steady_clock::now();
  const int64_t next = NextId(store);
  const double next_ms = MillisecondsSince(start);
  EXPECT_EQ(next, 6);  // priority 2 (ids 3, 6, 9, ...), odd ids ended

  std::printf("[ timing ] %d jobs (~3 KB of spec each): List(all) %.1f ms, List(all, without spec) %.1f ms, "
              "List(active) %.1f ms, Get x%d %.1f ms (%.4f ms each), NextQueued %.3f ms; Add %.2f ms each (one "
              "fsynced commit)\n",
              kJobs, list_all_ms, list_summaries_ms, list_active_ms, kJobs, get_all_ms, get_all_ms / kJobs, next_ms,
              add_ms / kAddedOneByOne);
  // A loose bound that only catches a gross regression (e.g. one query per row).
  EXPECT_LT(list_all_ms, 5000.0);
}

}  // namespace
}  // namespace trainerd::daemon
