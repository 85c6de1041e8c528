#include "daemon/job_store.h"

#include <sqlite3.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <system_error>
#include <utility>

namespace trainerd::daemon {

namespace {

// Migration N takes a file from schema version N-1 to N. Append only: never
// edit a migration that has shipped, since files in the field already ran it.
struct Migration {
  int version;
  const char* sql;
};

// REAL columns are nullable on purpose: SQLite stores a bound NaN as NULL, and
// a diverged run reports a NaN loss. NULL reads back as NaN.
constexpr Migration kMigrations[] = {
    {1, R"sql(
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
)sql"},
    // NextQueued's lookup and order (state = 'queued' ORDER BY priority DESC,
    // queue_pos) straight from the index.
    {2, R"sql(
CREATE INDEX jobs_by_queue_order ON jobs (state, priority DESC, queue_pos);
)sql"},
};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == JobStore::kSchemaVersion,
              "one migration per schema version");

// The column order RowToRecord reads.
#define TRAINERD_JOB_COLUMNS                                                                     \
  "id, name, owner_uid, state, priority, queue_pos, submitted_unix_ms, started_unix_ms, "        \
  "finished_unix_ms, attempt, spec_yaml, spec_source, spec_base_dir, spec_json, output_dir, "    \
  "log_path, device, progress_step, progress_total_steps, progress_epoch, progress_loss, "       \
  "progress_learning_rate, progress_grad_norm, progress_tokens_per_second, progress_mfu, "       \
  "progress_peak_memory_bytes, progress_elapsed_seconds, progress_eta_seconds, "                 \
  "progress_eval_loss, result_exit_code, result_signal, result_output_path, result_eval_loss, "  \
  "reason"
// The same columns with the spec text left out (ListDetail::kWithoutSpec).
#define TRAINERD_JOB_SUMMARY_COLUMNS                                                                 \
  "id, name, owner_uid, state, priority, queue_pos, submitted_unix_ms, started_unix_ms, "          \
  "finished_unix_ms, attempt, '', spec_source, spec_base_dir, '', output_dir, "                    \
  "log_path, device, progress_step, progress_total_steps, progress_epoch, progress_loss, "         \
  "progress_learning_rate, progress_grad_norm, progress_tokens_per_second, progress_mfu, "         \
  "progress_peak_memory_bytes, progress_elapsed_seconds, progress_eta_seconds, "                   \
  "progress_eval_loss, result_exit_code, result_signal, result_output_path, result_eval_loss, "    \
  "reason"
constexpr int kStateColumn = 3;

constexpr const char* kRecoveredReason = "interrupted; resumes from its last checkpoint";
constexpr int kBusyTimeoutMs = 5000;

// A prepared statement, finalized on destruction.
class Statement {
 public:
  Statement() = default;
  explicit Statement(sqlite3_stmt* stmt) : stmt_(stmt) {}
  Statement(Statement&& other) noexcept : stmt_(std::exchange(other.stmt_, nullptr)) {}
  Statement& operator=(Statement&& other) noexcept {
    if (this != &other) {
      sqlite3_finalize(stmt_);
      stmt_ = std::exchange(other.stmt_, nullptr);
    }
    return *this;
  }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }

  sqlite3_stmt* get() const { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

// One use of a prepared statement. On scope exit the statement is reset (so
// it holds no read snapshot that would stall WAL checkpoints) and its
// bindings cleared. A failed bind is remembered and returned by Step.
class StatementUse {
 public:
  explicit StatementUse(const Statement& statement) : stmt_(statement.get()) {}
  ~StatementUse() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  StatementUse(const StatementUse&) = delete;
  StatementUse& operator=(const StatementUse&) = delete;

  void Bind(int index, int64_t value) { Check(sqlite3_bind_int64(stmt_, index, value)); }
  void Bind(int index, double value) { Check(sqlite3_bind_double(stmt_, index, value)); }
  void Bind(int index, const std::string& value) {
    Check(sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  }
  void Bind(int index, const char* value) { Bind(index, std::string(value)); }

  // SQLITE_ROW, SQLITE_DONE or an error code.
  int Step() { return bind_error_ != SQLITE_OK ? bind_error_ : sqlite3_step(stmt_); }

  sqlite3_stmt* get() const { return stmt_; }
  int64_t Int(int column) const { return sqlite3_column_int64(stmt_, column); }
  double Real(int column) const {
    if (sqlite3_column_type(stmt_, column) == SQLITE_NULL) return std::numeric_limits<double>::quiet_NaN();
    return sqlite3_column_double(stmt_, column);
  }
  std::string Text(int column) const {
    const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
    if (text == nullptr) return std::string();
    return std::string(text, static_cast<size_t>(sqlite3_column_bytes(stmt_, column)));
  }

 private:
  void Check(int rc) {
    if (rc != SQLITE_OK && bind_error_ == SQLITE_OK) bind_error_ = rc;
  }
  sqlite3_stmt* stmt_;
  int bind_error_ = SQLITE_OK;
};

bool SameDouble(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

struct DbCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};

}  // namespace

const char* JobStateName(JobState state) {
  switch (state) {
    case JobState::kQueued: return "queued";
    case JobState::kRunning: return "running";
    case JobState::kSucceeded: return "succeeded";
    case JobState::kFailed: return "failed";
    case JobState::kCancelled: return "cancelled";
    case JobState::kInterrupted: return "interrupted";
  }
  return "unknown";
}

std::optional<JobState> ParseJobState(std::string_view name) {
  for (JobState state : {JobState::kQueued, JobState::kRunning, JobState::kSucceeded, JobState::kFailed,
                         JobState::kCancelled, JobState::kInterrupted}) {
    if (name == JobStateName(state)) return state;
  }
  return std::nullopt;
}

bool IsEnded(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed || state == JobState::kCancelled;
}

bool JobProgress::operator==(const JobProgress& o) const {
  return step == o.step && total_steps == o.total_steps && SameDouble(epoch, o.epoch) &&
         SameDouble(loss, o.loss) && SameDouble(learning_rate, o.learning_rate) &&
         SameDouble(grad_norm, o.grad_norm) && SameDouble(tokens_per_second, o.tokens_per_second) &&
         SameDouble(mfu, o.mfu) && peak_memory_bytes == o.peak_memory_bytes &&
         SameDouble(elapsed_seconds, o.elapsed_seconds) && SameDouble(eta_seconds, o.eta_seconds) &&
         SameDouble(eval_loss, o.eval_loss);
}

bool JobResult::operator==(const JobResult& o) const {
  return exit_code == o.exit_code && signal == o.signal && output_path == o.output_path &&
         SameDouble(eval_loss, o.eval_loss);
}

bool JobRecord::operator==(const JobRecord& o) const {
  return id == o.id && name == o.name && owner_uid == o.owner_uid && state == o.state &&
         priority == o.priority && submitted_unix_ms == o.submitted_unix_ms &&
         started_unix_ms == o.started_unix_ms && finished_unix_ms == o.finished_unix_ms &&
         attempt == o.attempt && spec_yaml == o.spec_yaml && spec_source == o.spec_source &&
         spec_base_dir == o.spec_base_dir && spec_json == o.spec_json && output_dir == o.output_dir &&
         log_path == o.log_path && device == o.device && progress == o.progress && result == o.result &&
         reason == o.reason && queue_pos == o.queue_pos;
}

struct JobStore::Impl {
  std::string path;
  // Declared before the statements so that it is destroyed after them.
  std::unique_ptr<sqlite3, DbCloser> db;

  Statement begin, commit, rollback;
  Statement insert, get, list_all, list_active, list_all_summary, list_active_summary, next_queued, state_of;
  Statement mark_running, update_progress, finish, cancel, set_paths;
  Statement recover_select, recover_min_pos, recover_update;

  // "job store <path>: <op>: <sqlite's message>".
  Status Error(const std::string& op, int rc) const {
    std::string what = db ? sqlite3_errmsg(db.get()) : sqlite3_errstr(rc);
    if (what.empty() || what == "not an error") what = sqlite3_errstr(rc);
    return Status::Error("job store " + path + ": " + op + ": " + what);
  }
  Status Fail(const std::string& op, const std::string& what) const {
    return Status::Error("job store " + path + ": " + op + ": " + what);
  }

  // `op` names the operation in an error; by default the SQL itself.
  Status Prepare(Statement* out, const char* sql, const std::string& op = "") {
    sqlite3_stmt* stmt = nullptr;
    int rc = sqlite3_prepare_v3(db.get(), sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    if (rc != SQLITE_OK) {
      Status error = Error(op.empty() ? std::string("prepare \"") + sql + "\"" : op, rc);
      sqlite3_finalize(stmt);
      return error;
    }
    *out = Statement(stmt);
    return Status::Ok();
  }

  // Runs a statement that needs no bindings and whose rows, if any, are not needed.
  Status Run(const Statement& statement, const std::string& op) {
    StatementUse use(statement);
    int rc;
    while ((rc = use.Step()) == SQLITE_ROW) {
    }
    return rc == SQLITE_DONE ? Status::Ok() : Error(op, rc);
  }

  // A one-off statement (Open, migrations); yields the first column of the
  // first row as text, "" when there is none.
  StatusOr<std::string> QueryOnce(const std::string& sql, const std::string& op) {
    Statement statement;
    TRAINERD_RETURN_IF_ERROR(Prepare(&statement, sql.c_str(), op));
    StatementUse use(statement);
    std::string first;
    bool have_first = false;
    int rc;
    while ((rc = use.Step()) == SQLITE_ROW) {
      if (!have_first) first = use.Text(0);
      have_first = true;
    }
    if (rc != SQLITE_DONE) return Error(op, rc);
    return first;
  }

  Status ExecScript(const char* sql, const std::string& op) {
    char* message = nullptr;
    int rc = sqlite3_exec(db.get(), sql, nullptr, nullptr, &message);
    if (rc == SQLITE_OK) return Status::Ok();
    std::string what = message ? message : sqlite3_errstr(rc);
    sqlite3_free(message);
    return Fail(op, what);
  }

  class Transaction;

  Status Configure();
  Status Migrate();
  Status PrepareAll();

  StatusOr<JobRecord> RowToRecord(const StatementUse& row) const;
  StatusOr<std::optional<JobRecord>> FetchOne(StatementUse& use, const std::string& op);
  // Why an update of job `id` that expected `expected` states touched no row.
  Status ExplainNoChange(int64_t id, const std::string& op, const std::string& expected);
};

// A write transaction (BEGIN IMMEDIATE: takes the write lock up front, so no
// read-then-write upgrade can fail with SQLITE_BUSY halfway). Rolled back on
// destruction unless committed.
class JobStore::Impl::Transaction {
 public:
  explicit Transaction(JobStore::Impl* impl) : impl_(impl) {}
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  ~Transaction() {
    if (open_) (void)impl_->Run(impl_->rollback, "rollback");
  }
  Status Begin(const std::string& op) {
    TRAINERD_RETURN_IF_ERROR(impl_->Run(impl_->begin, op + ": begin transaction"));
    open_ = true;
    return Status::Ok();
  }
  Status Commit(const std::string& op) {
    TRAINERD_RETURN_IF_ERROR(impl_->Run(impl_->commit, op + ": commit"));
    open_ = false;
    return Status::Ok();
  }

 private:
  JobStore::Impl* impl_;
  bool open_ = false;
};

Status JobStore::Impl::Configure() {
  sqlite3_busy_timeout(db.get(), kBusyTimeoutMs);
  // The first read of the file: one that is not SQLite fails here.
  {
    sqlite3_stmt* raw = nullptr;
    int rc = sqlite3_prepare_v2(db.get(), "SELECT count(*) FROM sqlite_master", -1, &raw, nullptr);
    Statement probe(raw);
    if (rc == SQLITE_OK) {
      StatementUse use(probe);
      rc = use.Step();
      if (rc == SQLITE_ROW) rc = SQLITE_OK;
    }
    if ((rc & 0xff) == SQLITE_NOTADB) {
      return Fail("open", "not a SQLite database (" + std::string(sqlite3_errstr(rc)) +
                              "): move the file aside or choose another state directory");
    }
    if (rc != SQLITE_OK) return Error("read schema", rc);
  }
  TRAINERD_ASSIGN_OR_RETURN(std::string mode, QueryOnce("PRAGMA journal_mode=WAL", "set journal_mode=WAL"));
  if (mode != "wal") {
    return Fail("set journal_mode=WAL", "SQLite kept journal mode \"" + mode +
                                            "\"; WAL needs a local file system (not NFS): put the state "
                                            "directory on one");
  }
  return ExecScript("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;", "set synchronous=FULL, foreign_keys=ON");
}

Status JobStore::Impl::Migrate() {
  const std::string op = "migrate schema";
  Transaction txn(this);
  TRAINERD_RETURN_IF_ERROR(txn.Begin(op));
  TRAINERD_ASSIGN_OR_RETURN(
      std::string has_version_table,
      QueryOnce("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'",
                "read schema version"));
  int64_t version = 0;
  if (has_version_table == "0") {
    TRAINERD_ASSIGN_OR_RETURN(std::string objects, QueryOnce("SELECT count(*) FROM sqlite_master", "read schema"));
    if (objects != "0") {
      return Fail("open",
                  "a SQLite database but not a trainerd job store (it has tables but no schema_version): move "
                  "the file aside or choose another state directory");
    }
    TRAINERD_RETURN_IF_ERROR(ExecScript(
        "CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version (version) VALUES (0);",
        "create schema_version"));
  } else {
    TRAINERD_ASSIGN_OR_RETURN(std::string rows, QueryOnce("SELECT count(*) FROM schema_version", "read schema version"));
    if (rows != "1") {
      return Fail("read schema version", "schema_version holds " + rows +
                                             " rows, expected 1: the file is damaged; restore a backup or move it aside");
    }
    TRAINERD_ASSIGN_OR_RETURN(std::string text, QueryOnce("SELECT version FROM schema_version", "read schema version"));
    char* end = nullptr;
    version = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || version < 0) {
      return Fail("read schema version", "schema_version holds \"" + text +
                                             "\", not a version number: the file is damaged; restore a backup or "
                                             "move it aside");
    }
  }
  if (version > kSchemaVersion) {
    return Fail("open", "schema version " + std::to_string(version) + " is newer than this trainerd supports (" +
                            std::to_string(kSchemaVersion) +
                            "); the file was written by a newer trainerd, and is not downgraded: run that "
                            "version, or move the file aside to start an empty queue");
  }
  for (const Migration& migration : kMigrations) {
    if (migration.version <= version) continue;
    const std::string step =
        "migrate schema v" + std::to_string(migration.version - 1) + " to v" + std::to_string(migration.version);
    TRAINERD_RETURN_IF_ERROR(ExecScript(migration.sql, step));
    TRAINERD_RETURN_IF_ERROR(ExecScript(
        ("UPDATE schema_version SET version = " + std::to_string(migration.version)).c_str(), step));
  }
  return txn.Commit(op);
}

Status JobStore::Impl::PrepareAll() {
  struct {
    Statement* statement;
    const char* sql;
  } const statements[] = {
      {&insert,
       "INSERT INTO jobs (name, owner_uid, state, priority, queue_pos, submitted_unix_ms, spec_yaml, spec_source, "
       "spec_base_dir, spec_json, output_dir, log_path) VALUES (?1, ?2, 'queued', ?3, "
       // Above every position so far: Add's positions are at most their job's
       // id, recovered ones are below all others.
       "(SELECT COALESCE(MAX(id), 0) + 1 FROM jobs), ?4, ?5, ?6, ?7, ?8, ?9, ?10)"},
      {&get, "SELECT " TRAINERD_JOB_COLUMNS " FROM jobs WHERE id = ?1"},
      {&list_all, "SELECT " TRAINERD_JOB_COLUMNS " FROM jobs ORDER BY id"},
      {&list_all_summary, "SELECT " TRAINERD_JOB_SUMMARY_COLUMNS " FROM jobs ORDER BY id"},
      {&list_active_summary,
       "SELECT " TRAINERD_JOB_SUMMARY_COLUMNS
       " FROM jobs WHERE state IN ('queued', 'running', 'interrupted') ORDER BY id"},
      {&list_active,
       "SELECT " TRAINERD_JOB_COLUMNS " FROM jobs WHERE state IN ('queued', 'running', 'interrupted') ORDER BY id"},
      {&next_queued,
       "SELECT " TRAINERD_JOB_COLUMNS " FROM jobs WHERE state = 'queued' ORDER BY priority DESC, queue_pos LIMIT 1"},
      {&state_of, "SELECT state FROM jobs WHERE id = ?1"},
      {&mark_running,
       "UPDATE jobs SET state = 'running', device = ?2, started_unix_ms = ?3, attempt = attempt + 1, "
       "finished_unix_ms = 0, result_exit_code = 0, result_signal = 0, result_output_path = '', "
       "result_eval_loss = 0, reason = '' WHERE id = ?1 AND state = 'queued'"},
      {&update_progress,
       "UPDATE jobs SET progress_step = ?2, progress_total_steps = ?3, progress_epoch = ?4, progress_loss = ?5, "
       "progress_learning_rate = ?6, progress_grad_norm = ?7, progress_tokens_per_second = ?8, progress_mfu = ?9, "
       "progress_peak_memory_bytes = ?10, progress_elapsed_seconds = ?11, progress_eta_seconds = ?12, "
       "progress_eval_loss = ?13 WHERE id = ?1 AND state = 'running'"},
      {&finish,
       "UPDATE jobs SET state = ?2, result_exit_code = ?3, result_signal = ?4, result_output_path = ?5, "
       "result_eval_loss = ?6, reason = ?7, finished_unix_ms = ?8 WHERE id = ?1 AND state = 'running'"},
      {&cancel,
       "UPDATE jobs SET state = 'cancelled', reason = ?2, finished_unix_ms = ?3 "
       "WHERE id = ?1 AND state IN ('queued', 'interrupted')"},
      {&set_paths, "UPDATE jobs SET output_dir = ?2, log_path = ?3 WHERE id = ?1"},
      {&recover_select, "SELECT id FROM jobs WHERE state IN ('running', 'interrupted') ORDER BY queue_pos, id"},
      {&recover_min_pos, "SELECT MIN(queue_pos) FROM jobs WHERE state IN ('queued', 'running', 'interrupted')"},
      {&recover_update, "UPDATE jobs SET state = 'queued', queue_pos = ?2, reason = ?3 WHERE id = ?1"},
  };
  for (const auto& entry : statements) TRAINERD_RETURN_IF_ERROR(Prepare(entry.statement, entry.sql));
  return Status::Ok();
}

StatusOr<JobRecord> JobStore::Impl::RowToRecord(const StatementUse& row) const {
  JobRecord job;
  int c = 0;
  job.id = row.Int(c++);
  job.name = row.Text(c++);
  job.owner_uid = static_cast<uint32_t>(row.Int(c++));
  std::string state = row.Text(c++);
  std::optional<JobState> parsed = ParseJobState(state);
  if (!parsed) {
    return Fail("read job " + std::to_string(job.id), "unknown state \"" + state + "\"");
  }
  job.state = *parsed;
  job.priority = static_cast<int32_t>(row.Int(c++));
  job.queue_pos = row.Int(c++);
  job.submitted_unix_ms = row.Int(c++);
  job.started_unix_ms = row.Int(c++);
  job.finished_unix_ms = row.Int(c++);
  job.attempt = static_cast<int32_t>(row.Int(c++));
  job.spec_yaml = row.Text(c++);
  job.spec_source = row.Text(c++);
  job.spec_base_dir = row.Text(c++);
  job.spec_json = row.Text(c++);
  job.output_dir = row.Text(c++);
  job.log_path = row.Text(c++);
  job.device = row.Text(c++);
  JobProgress& p = job.progress;
  p.step = row.Int(c++);
  p.total_steps = row.Int(c++);
  p.epoch = row.Real(c++);
  p.loss = row.Real(c++);
  p.learning_rate = row.Real(c++);
  p.grad_norm = row.Real(c++);
  p.tokens_per_second = row.Real(c++);
  p.mfu = row.Real(c++);
  p.peak_memory_bytes = row.Int(c++);
  p.elapsed_seconds = row.Real(c++);
  p.eta_seconds = row.Real(c++);
  p.eval_loss = row.Real(c++);
  job.result.exit_code = static_cast<int32_t>(row.Int(c++));
  job.result.signal = static_cast<int32_t>(row.Int(c++));
  job.result.output_path = row.Text(c++);
  job.result.eval_loss = row.Real(c++);
  job.reason = row.Text(c++);
  return job;
}

StatusOr<std::optional<JobRecord>> JobStore::Impl::FetchOne(StatementUse& use, const std::string& op) {
  int rc = use.Step();
  if (rc == SQLITE_DONE) return std::optional<JobRecord>();
  if (rc != SQLITE_ROW) return Error(op, rc);
  TRAINERD_ASSIGN_OR_RETURN(JobRecord job, RowToRecord(use));
  return std::optional<JobRecord>(std::move(job));
}

Status JobStore::Impl::ExplainNoChange(int64_t id, const std::string& op, const std::string& expected) {
  StatementUse use(state_of);
  use.Bind(1, id);
  int rc = use.Step();
  if (rc == SQLITE_DONE) return Fail(op, "no job " + std::to_string(id));
  if (rc != SQLITE_ROW) return Error(op, rc);
  return Fail(op, "job " + std::to_string(id) + " is " + use.Text(0) + ", not " + expected);
}

JobStore::JobStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JobStore::JobStore(JobStore&&) noexcept = default;
JobStore& JobStore::operator=(JobStore&&) noexcept = default;
JobStore::~JobStore() = default;

const std::string& JobStore::path() const { return impl_->path; }

StatusOr<JobStore> JobStore::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) return impl->Fail("create folder " + parent.string(), ec.message());
  }
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  impl->db.reset(raw);  // closed on every return below, even when open failed
  if (rc != SQLITE_OK) return impl->Error("open", rc);
  TRAINERD_RETURN_IF_ERROR(impl->Configure());
  TRAINERD_RETURN_IF_ERROR(impl->Prepare(&impl->begin, "BEGIN IMMEDIATE"));
  TRAINERD_RETURN_IF_ERROR(impl->Prepare(&impl->commit, "COMMIT"));
  TRAINERD_RETURN_IF_ERROR(impl->Prepare(&impl->rollback, "ROLLBACK"));
  TRAINERD_RETURN_IF_ERROR(impl->Migrate());
  TRAINERD_RETURN_IF_ERROR(impl->PrepareAll());
  return JobStore(std::move(impl));
}

StatusOr<int64_t> JobStore::Add(const JobRecord& job) {
  StatementUse use(impl_->insert);
  use.Bind(1, job.name);
  use.Bind(2, static_cast<int64_t>(job.owner_uid));
  use.Bind(3, static_cast<int64_t>(job.priority));
  use.Bind(4, job.submitted_unix_ms);
  use.Bind(5, job.spec_yaml);
  use.Bind(6, job.spec_source);
  use.Bind(7, job.spec_base_dir);
  use.Bind(8, job.spec_json);
  use.Bind(9, job.output_dir);
  use.Bind(10, job.log_path);
  int rc = use.Step();
  if (rc != SQLITE_DONE) return impl_->Error("insert job", rc);
  return static_cast<int64_t>(sqlite3_last_insert_rowid(impl_->db.get()));
}

StatusOr<std::optional<JobRecord>> JobStore::Get(int64_t id) {
  StatementUse use(impl_->get);
  use.Bind(1, id);
  return impl_->FetchOne(use, "read job " + std::to_string(id));
}

StatusOr<std::vector<JobRecord>> JobStore::List(bool include_ended, const std::vector<JobState>& states,
                                                ListDetail detail) {
  const bool all = include_ended || !states.empty();
  const Statement& statement = detail == ListDetail::kFull ? (all ? impl_->list_all : impl_->list_active)
                                                           : (all ? impl_->list_all_summary : impl_->list_active_summary);
  StatementUse use(statement);
  std::vector<JobRecord> jobs;
  int rc;
  while ((rc = use.Step()) == SQLITE_ROW) {
    if (!states.empty()) {
      std::optional<JobState> state = ParseJobState(use.Text(kStateColumn));
      bool wanted = false;
      for (JobState s : states) wanted = wanted || (state && *state == s);
      if (!wanted) continue;
    }
    TRAINERD_ASSIGN_OR_RETURN(JobRecord job, impl_->RowToRecord(use));
    jobs.push_back(std::move(job));
  }
  if (rc != SQLITE_DONE) return impl_->Error("list jobs", rc);
  return jobs;
}

StatusOr<std::optional<JobRecord>> JobStore::NextQueued() {
  StatementUse use(impl_->next_queued);
  return impl_->FetchOne(use, "read the next queued job");
}

Status JobStore::MarkRunning(int64_t id, const std::string& device, int64_t started_unix_ms) {
  const std::string op = "mark job " + std::to_string(id) + " running";
  {
    StatementUse use(impl_->mark_running);
    use.Bind(1, id);
    use.Bind(2, device);
    use.Bind(3, started_unix_ms);
    int rc = use.Step();
    if (rc != SQLITE_DONE) return impl_->Error(op, rc);
  }
  if (sqlite3_changes(impl_->db.get()) == 0) return impl_->ExplainNoChange(id, op, "queued");
  return Status::Ok();
}

Status JobStore::UpdateProgress(int64_t id, const JobProgress& p) {
  const std::string op = "update job " + std::to_string(id) + "'s progress";
  {
    StatementUse use(impl_->update_progress);
    use.Bind(1, id);
    use.Bind(2, p.step);
    use.Bind(3, p.total_steps);
    use.Bind(4, p.epoch);
    use.Bind(5, p.loss);
    use.Bind(6, p.learning_rate);
    use.Bind(7, p.grad_norm);
    use.Bind(8, p.tokens_per_second);
    use.Bind(9, p.mfu);
    use.Bind(10, p.peak_memory_bytes);
    use.Bind(11, p.elapsed_seconds);
    use.Bind(12, p.eta_seconds);
    use.Bind(13, p.eval_loss);
    int rc = use.Step();
    if (rc != SQLITE_DONE) return impl_->Error(op, rc);
  }
  if (sqlite3_changes(impl_->db.get()) == 0) return impl_->ExplainNoChange(id, op, "running");
  return Status::Ok();
}

Status JobStore::Finish(int64_t id, JobState state, const JobResult& result, const std::string& reason,
                        int64_t finished_unix_ms) {
  const std::string op = "finish job " + std::to_string(id) + " as " + JobStateName(state);
  if (state == JobState::kQueued || state == JobState::kRunning) {
    return impl_->Fail(op, "a job finishes as succeeded, failed, cancelled or interrupted");
  }
  {
    StatementUse use(impl_->finish);
    use.Bind(1, id);
    use.Bind(2, JobStateName(state));
    use.Bind(3, static_cast<int64_t>(result.exit_code));
    use.Bind(4, static_cast<int64_t>(result.signal));
    use.Bind(5, result.output_path);
    use.Bind(6, result.eval_loss);
    use.Bind(7, reason);
    use.Bind(8, finished_unix_ms);
    int rc = use.Step();
    if (rc != SQLITE_DONE) return impl_->Error(op, rc);
  }
  if (sqlite3_changes(impl_->db.get()) == 0) return impl_->ExplainNoChange(id, op, "running");
  return Status::Ok();
}

Status JobStore::Cancel(int64_t id, const std::string& reason, int64_t now_unix_ms) {
  const std::string op = "cancel job " + std::to_string(id);
  {
    StatementUse use(impl_->cancel);
    use.Bind(1, id);
    use.Bind(2, reason);
    use.Bind(3, now_unix_ms);
    int rc = use.Step();
    if (rc != SQLITE_DONE) return impl_->Error(op, rc);
  }
  if (sqlite3_changes(impl_->db.get()) == 0) return impl_->ExplainNoChange(id, op, "queued or interrupted");
  return Status::Ok();
}

Status JobStore::SetPaths(int64_t id, const std::string& output_dir, const std::string& log_path) {
  const std::string op = "set job " + std::to_string(id) + "'s paths";
  {
    StatementUse use(impl_->set_paths);
    use.Bind(1, id);
    use.Bind(2, output_dir);
    use.Bind(3, log_path);
    int rc = use.Step();
    if (rc != SQLITE_DONE) return impl_->Error(op, rc);
  }
  if (sqlite3_changes(impl_->db.get()) == 0) return impl_->Fail(op, "no job " + std::to_string(id));
  return Status::Ok();
}

StatusOr<std::vector<int64_t>> JobStore::RecoverAfterRestart() {
  const std::string op = "requeue interrupted jobs";
  Impl::Transaction txn(impl_.get());
  TRAINERD_RETURN_IF_ERROR(txn.Begin(op));
  std::vector<int64_t> ids;
  {
    StatementUse use(impl_->recover_select);
    int rc;
    while ((rc = use.Step()) == SQLITE_ROW) ids.push_back(use.Int(0));
    if (rc != SQLITE_DONE) return impl_->Error(op, rc);
  }
  if (ids.empty()) return ids;  // the transaction rolls back: nothing was written
  int64_t min_pos = 0;
  {
    StatementUse use(impl_->recover_min_pos);
    int rc = use.Step();
    if (rc != SQLITE_ROW) return impl_->Error(op, rc);
    min_pos = use.Int(0);
  }
  const int64_t first = min_pos - static_cast<int64_t>(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    StatementUse use(impl_->recover_update);
    use.Bind(1, ids[i]);
    use.Bind(2, first + static_cast<int64_t>(i));
    use.Bind(3, kRecoveredReason);
    int rc = use.Step();
    if (rc != SQLITE_DONE) return impl_->Error(op + ": job " + std::to_string(ids[i]), rc);
  }
  TRAINERD_RETURN_IF_ERROR(txn.Commit(op));
  return ids;
}

StatusOr<std::string> JobStore::PragmaValue(const std::string& name) {
  bool identifier = !name.empty();
  for (char ch : name) identifier = identifier && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_');
  if (!identifier) return impl_->Fail("read pragma", "\"" + name + "\" is not a pragma name");
  return impl_->QueryOnce("PRAGMA " + name, "read pragma " + name);
}

}  // namespace trainerd::daemon
