// The daemon's configuration: where trainerd listens and keeps its state, which
// GPUs it schedules on, which worker it runs and a few defaults for jobs.
//
// Every key is optional. DefaultDaemonConfig picks the defaults for how trainerd
// runs (the system service, or a user's own daemon); LoadDaemonConfig reads
// `etc/trainerd.yaml` (installed as /etc/trainerd/trainerd.yaml) over them, with
// errors naming file, line and key ("trainerd.yaml:4: log_level: unknown value
// 'warning'; allowed: ... (did you mean 'warn'?)"). docs/daemon-config.md documents
// every key for users; keep the two, and etc/trainerd.yaml, in step.
//
// yaml-cpp-free: plain structs.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace trainerd {

// Environment variables as DefaultDaemonConfig sees them: the process's own, or
// a fixed set, so tests need not change the real environment.
class EnvironmentView {
 public:
  // Reads the process environment (getenv) at each Get.
  static EnvironmentView Process() { return EnvironmentView(); }
  // Only `variables`; everything else is unset.
  explicit EnvironmentView(std::map<std::string, std::string> variables)
      : variables_(std::move(variables)) {}

  // The variable's value; nullopt when it is unset or empty.
  std::optional<std::string> Get(const std::string& name) const;

 private:
  EnvironmentView() = default;
  std::optional<std::map<std::string, std::string>> variables_;  // nullopt: the process's
};

struct DaemonConfig {
  // The unix socket trainctl connects to. System: $RUNTIME_DIRECTORY/trainerd.sock,
  // else /run/trainerd/trainerd.sock; user: $XDG_RUNTIME_DIR/trainerd/trainerd.sock,
  // else /run/user/UID/trainerd/trainerd.sock. Absolute.
  std::string socket_path;
  // The job queue (SQLite) and per-job folders. System: $STATE_DIRECTORY, else
  // /var/lib/trainerd; user: $XDG_STATE_HOME/trainerd, else ~/.local/state/trainerd.
  // Absolute.
  std::string state_dir;
  // Empty: every GPU the worker reports; {"cpu"}: train on the CPU; else distinct
  // "cuda:N" entries, in the order written.
  std::vector<std::string> gpus;
  // The trainerd-worker binary; by default the one next to the trainerd binary.
  std::string worker_path;
  std::string log_level = "info";  // trace | debug | info | warn | error
  // Seconds between SIGTERM (checkpoint and stop) and SIGKILL for a worker told
  // to stop; >= 1.
  int64_t stop_grace_seconds = 120;
  // training.checkpoint_every for jobs whose spec does not set it; 0 = the job
  // spec's own default (no periodic checkpoints). >= 0.
  int64_t checkpoint_every = 0;
  // True when trainerd runs as a user's own daemon, false as the system service.
  bool user_mode = false;
};

bool operator==(const DaemonConfig& a, const DaemonConfig& b);
inline bool operator!=(const DaemonConfig& a, const DaemonConfig& b) { return !(a == b); }

// The log levels log_level takes, most verbose first.
const std::vector<std::string>& DaemonLogLevels();

// The defaults for this process. It is the system service when `uid` is 0 or
// systemd set $STATE_DIRECTORY or $RUNTIME_DIRECTORY (each used when set; of a
// colon-separated list, the first); otherwise it runs for the user, under
// $XDG_STATE_HOME (else $HOME/.local/state, else the passwd entry's home) and
// $XDG_RUNTIME_DIR (else /run/user/UID when writable). An error when a user's
// runtime or home folder cannot be found, saying which variable to set.
// Relative XDG values are ignored, as the XDG spec says. `binary_dir` is the
// folder of the trainerd binary: trainerd-worker is looked for there.
StatusOr<DaemonConfig> DefaultDaemonConfig(const EnvironmentView& env, uid_t uid,
                                           const std::string& binary_dir);

// Reads the config file at `path` over `defaults`. A missing file is fine when
// `path` is the default location (`explicit_path` false) and an error when the
// user named it (--config). An empty file, or one of comments only, gives the
// defaults. Relative paths in it resolve against the file's folder. Unknown keys
// (with a suggestion), wrong types and bad values are errors naming file:line and key.
StatusOr<DaemonConfig> LoadDaemonConfig(const std::string& path, bool explicit_path,
                                        DaemonConfig defaults);

// Parses config text; `source` names it in messages and `base_dir` (absolute)
// is what relative paths resolve against. LoadDaemonConfig's parser.
StatusOr<DaemonConfig> ParseDaemonConfigText(const std::string& text, const std::string& source,
                                             const std::string& base_dir, DaemonConfig defaults);

}  // namespace trainerd
