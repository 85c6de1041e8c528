// trainerd: the fine-tuning job daemon (docs/ARCHITECTURE.md, docs/daemon-config.md).
//
//   trainerd [--config FILE] [--socket PATH] [--state-dir DIR] [--gpus LIST] [--worker PATH]
//            [--log-level LEVEL]
//
// Start-up: read the config (flags override it), open the queue
// (<state_dir>/queue.db) and put jobs left running or interrupted back at the
// head of the queue, listen on the socket (or take systemd's, trainerd.socket),
// tell systemd READY=1, then find the GPUs and start jobs. Signals: SIGTERM or
// SIGINT stop (workers checkpoint, their jobs become interrupted, and resume
// at the next start), SIGHUP re-reads the config.
//
// Exit status: 0 after a clean stop; 1 when it cannot start (the reason on stderr).
//
// One thread: the io_context runs on the main thread; training runs in
// trainerd-worker processes, never here.
#include <fcntl.h>
#include <limits.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <boost/asio.hpp>
#include <spdlog/spdlog.h>

#include "common/daemon_config.h"
#include "common/log_setup.h"
#include "daemon/job_logs.h"
#include "daemon/job_registry.h"
#include "daemon/job_service.h"
#include "daemon/job_store.h"
#include "daemon/server.h"
#include "daemon/supervisor.h"
#include "daemon/systemd_notify.h"

namespace trainerd::daemon {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;

// While workers checkpoint at shutdown, systemd's stop timeout is pushed back
// by this much, every kExtendEvery.
constexpr std::chrono::seconds kExtendBy{30};
constexpr std::chrono::seconds kExtendEvery{10};
// STATUS= is sent at most this often while jobs report progress.
constexpr std::chrono::seconds kStatusEvery{2};

// Settings given on the command line; each overrides the config file's.
struct Flags {
  std::string config;
  std::optional<std::string> socket, state_dir, gpus, worker, log_level;
};

std::string BinaryDir() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "";
  return fs::path(std::string(path, static_cast<size_t>(n))).parent_path().string();
}

// Where the config is read from when --config is not given.
std::string DefaultConfigPath(const DaemonConfig& defaults) {
  if (!defaults.user_mode) return "/etc/trainerd/trainerd.yaml";
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  if (xdg && xdg[0] == '/') return std::string(xdg) + "/trainerd/trainerd.yaml";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/") + "/.config/trainerd/trainerd.yaml";
}

// The config: defaults for how trainerd runs, the file over them, the flags over that.
StatusOr<DaemonConfig> ReadConfig(const Flags& flags) {
  TRAINERD_ASSIGN_OR_RETURN(DaemonConfig defaults,
                            DefaultDaemonConfig(EnvironmentView::Process(), ::geteuid(), BinaryDir()));
  const bool explicit_path = !flags.config.empty();
  const std::string path = explicit_path ? flags.config : DefaultConfigPath(defaults);
  TRAINERD_ASSIGN_OR_RETURN(DaemonConfig config, LoadDaemonConfig(path, explicit_path, defaults));
  // Flags are written like config lines so they get the same checks and messages.
  std::string text;
  auto line = [&text](const char* key, const std::optional<std::string>& value, bool list = false) {
    if (!value) return;
    text += std::string(key) + ": " + (list ? "[" + *value + "]" : "'" + *value + "'") + "\n";
  };
  line("socket", flags.socket);
  line("state_dir", flags.state_dir);
  line("gpus", flags.gpus, /*list=*/flags.gpus && *flags.gpus != "all");
  line("worker", flags.worker);
  line("log_level", flags.log_level);
  if (text.empty()) return config;
  std::error_code ec;
  return ParseDaemonConfigText(text, "command line", fs::current_path(ec).string(), config);
}

class Daemon {
 public:
  Daemon(Flags flags, DaemonConfig config)
      : flags_(std::move(flags)),
        config_(std::move(config)),
        signals_(io_, SIGTERM, SIGINT, SIGHUP),
        status_timer_(io_),
        watchdog_timer_(io_),
        extend_timer_(io_) {}

  int Run() {
    Status started = Start();
    if (!started.ok()) {
      spdlog::error("cannot start: {}", started.message());
      return 1;
    }
    io_.run();
    spdlog::info("stopped");
    return 0;
  }

 private:
  Status Start() {
    const auto t0 = std::chrono::steady_clock::now();
    std::error_code ec;
    fs::create_directories(config_.state_dir + "/jobs", ec);
    if (ec) return Status::Error("creating the state folder " + config_.state_dir + ": " + ec.message());
    TRAINERD_RETURN_IF_ERROR(LockStateDir());
    TRAINERD_ASSIGN_OR_RETURN(JobStore store, JobStore::Open(config_.state_dir + "/queue.db"));
    store_ = std::make_unique<JobStore>(std::move(store));
    TRAINERD_ASSIGN_OR_RETURN(std::vector<int64_t> requeued, store_->RecoverAfterRestart());
    TRAINERD_ASSIGN_OR_RETURN(registry_, JobRegistry::Load(*store_));
    for (int64_t id : requeued) spdlog::info("{}back in the queue; resumes from its last checkpoint", JobLogPrefix(id));

    supervisor_ = std::make_unique<Supervisor>(io_, *registry_, logs_, SupervisorConfigOf(config_));
    JobService::Hooks hooks;
    hooks.job_queued = [this] { supervisor_->Schedule(); };
    hooks.stop_running = [this](int64_t id, const std::string& reason) { return supervisor_->Cancel(id, reason); };
    service_ = std::make_unique<JobService>(*registry_, logs_, config_.state_dir, JobService::Clock{}, hooks);
    registry_->SetStateListener([this](const JobRecord& job) {
      service_->OnJobChanged(job);
      UpdateStatus();  // queued counts; the supervisor updates it again once a worker runs
    });
    supervisor_->SetChangeListener([this](bool progress_only) {
      if (progress_only) {
        UpdateStatusSoon();
      } else {
        UpdateStatus();
      }
    });

    server_ = std::make_unique<Server>(io_, *service_);
    TRAINERD_ASSIGN_OR_RETURN(std::optional<int> systemd_fd, ListenFdFromSystemd());
    if (systemd_fd) {
      TRAINERD_RETURN_IF_ERROR(server_->Adopt(*systemd_fd));
      spdlog::info("listening on the socket systemd passed");
    } else {
      // The socket's group may connect (the system service's group trainerd); a user daemon's is private.
      TRAINERD_RETURN_IF_ERROR(server_->Listen(config_.socket_path, config_.user_mode ? 0600 : 0660));
      spdlog::info("listening on {}", config_.socket_path);
    }
    WaitForSignals();
    StartWatchdog();
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    spdlog::info("ready in {} ms: {} jobs in {}, {} queued", ms.count(), registry_->size(), config_.state_dir,
                 registry_->Count(JobState::kQueued));
    notifier_.Ready();
    supervisor_->Start();
    UpdateStatus();
    return Status::Ok();
  }

  // One trainerd per state folder: a second one would requeue and rerun the
  // first one's running jobs. The lock lives as long as the process (fd kept open).
  Status LockStateDir() {
    const std::string path = config_.state_dir + "/trainerd.lock";
    state_lock_fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (state_lock_fd_ < 0) return Status::Error("opening " + path + ": " + std::strerror(errno));
    if (::flock(state_lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      return Status::Error("another trainerd uses the state folder " + config_.state_dir +
                           " (it holds " + path + "); stop it, or give this one another --state-dir");
    }
    return Status::Ok();
  }

  static SupervisorConfig SupervisorConfigOf(const DaemonConfig& config) {
    SupervisorConfig s;
    s.worker_path = config.worker_path;
    s.state_dir = config.state_dir;
    s.gpus = config.gpus;
    s.stop_grace_seconds = config.stop_grace_seconds;
    s.checkpoint_every = config.checkpoint_every;
    return s;
  }

  void WaitForSignals() {
    signals_.async_wait([this](const boost::system::error_code& ec, int signal) {
      if (ec || stopped_) return;
      if (signal == SIGHUP) {
        Reload();
      } else {
        Stop(signal);
      }
      WaitForSignals();
    });
  }

  void Reload() {
    if (stopping_) {
      spdlog::info("SIGHUP while stopping: the config is not re-read");
      return;
    }
    notifier_.Reloading();
    StatusOr<DaemonConfig> config = ReadConfig(flags_);
    if (!config.ok()) {
      spdlog::error("reload: {}; keeping the running config", config.status().message());
      notifier_.Ready();
      return;
    }
    if (config->socket_path != config_.socket_path || config->state_dir != config_.state_dir) {
      spdlog::warn("reload: socket and state_dir take effect only when trainerd restarts");
    }
    Status level = SetUpLogging(config->log_level);
    if (!level.ok()) spdlog::error("reload: {}", level.message());
    supervisor_->Reconfigure(SupervisorConfigOf(*config));
    config_.gpus = config->gpus;
    config_.worker_path = config->worker_path;
    config_.log_level = config->log_level;
    config_.stop_grace_seconds = config->stop_grace_seconds;
    config_.checkpoint_every = config->checkpoint_every;
    spdlog::info("reloaded the config");
    notifier_.Ready();
  }

  void Stop(int signal) {
    if (stopping_) {
      spdlog::info("still stopping: waiting for {} worker(s) to checkpoint", supervisor_->running_count());
      return;
    }
    stopping_ = true;
    spdlog::info("{}: stopping; {} running job(s) checkpoint first", signal == SIGINT ? "SIGINT" : "SIGTERM",
                 supervisor_->running_count());
    notifier_.Stopping();
    ExtendWhileStopping();
    supervisor_->Shutdown([this] {
      spdlog::debug("every worker has stopped");
      // cancel() cannot recall a handler already queued with success: the
      // flag keeps such a handler from arming its timer (or the signal wait)
      // again, which would keep io_.run() from returning.
      stopped_ = true;
      extend_timer_.cancel();
      status_timer_.cancel();
      watchdog_timer_.cancel();
      signals_.cancel();
      server_->Stop();
    });
  }

  // Keeps systemd's stop timeout ahead of the workers' checkpoints.
  void ExtendWhileStopping() {
    notifier_.ExtendTimeout(kExtendBy);
    extend_timer_.expires_after(kExtendEvery);
    extend_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec && !stopped_) ExtendWhileStopping();
    });
  }

  void StartWatchdog() {
    const auto interval = SystemdNotifier::WatchdogInterval();
    if (interval.count() == 0) return;
    notifier_.Watchdog();
    // Twice per interval: the ping proves the io thread is turning.
    watchdog_timer_.expires_after(interval / 2);
    watchdog_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec && !stopped_) StartWatchdog();
    });
  }

  void UpdateStatus() { notifier_.Status(supervisor_->StatusLine()); }

  // Progress arrives every few steps: STATUS at most every kStatusEvery.
  void UpdateStatusSoon() {
    if (status_pending_ || stopped_) return;
    status_pending_ = true;
    status_timer_.expires_after(kStatusEvery);
    status_timer_.async_wait([this](const boost::system::error_code& ec) {
      status_pending_ = false;
      if (!ec) UpdateStatus();
    });
  }

  Flags flags_;
  DaemonConfig config_;
  asio::io_context io_;
  asio::signal_set signals_;
  asio::steady_timer status_timer_;
  asio::steady_timer watchdog_timer_;
  asio::steady_timer extend_timer_;
  SystemdNotifier notifier_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<JobRegistry> registry_;
  JobLogs logs_;
  std::unique_ptr<Supervisor> supervisor_;
  std::unique_ptr<JobService> service_;
  std::unique_ptr<Server> server_;
  bool stopping_ = false;
  bool stopped_ = false;  // every worker has stopped: nothing may arm a timer again
  bool status_pending_ = false;
  int state_lock_fd_ = -1;  // flock on <state_dir>/trainerd.lock, held until exit
};

}  // namespace
}  // namespace trainerd::daemon

int main(int argc, char** argv) {
  using trainerd::daemon::Flags;
  Flags flags;
  CLI::App app{"trainerd: the fine-tuning job daemon. trainctl talks to it; docs/daemon-config.md lists the settings."};
  app.add_option("--config", flags.config,
                 "config file (default /etc/trainerd/trainerd.yaml, or $XDG_CONFIG_HOME/trainerd/trainerd.yaml "
                 "for a user daemon)");
  app.add_option("--socket", flags.socket, "unix socket to listen on (config: socket)");
  app.add_option("--state-dir", flags.state_dir, "folder of the queue and the jobs (config: state_dir)");
  app.add_option("--gpus", flags.gpus, "devices to run jobs on: all, cpu, or cuda:0,cuda:1 (config: gpus)");
  app.add_option("--worker", flags.worker, "the trainerd-worker binary (config: worker)");
  app.add_option("--log-level", flags.log_level, "trace, debug, info, warn or error (config: log_level)");
  app.footer("Signals: SIGTERM/SIGINT stop (running jobs checkpoint and resume at the next start), "
             "SIGHUP re-reads the config.\nExit status: 0 stopped cleanly, 1 could not start, 2 usage error.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  // Errors before logging is set up: "<3>" (err) first under journald, as the logger would.
  const char* priority = trainerd::StderrIsJournal(std::getenv) ? "<3>" : "";
  trainerd::StatusOr<trainerd::DaemonConfig> config = trainerd::daemon::ReadConfig(flags);
  if (!config.ok()) {
    std::fprintf(stderr, "%strainerd: error: %s\n", priority, config.status().message().c_str());
    return 1;
  }
  trainerd::Status logging = trainerd::SetUpLogging(config->log_level);
  if (!logging.ok()) {
    std::fprintf(stderr, "%strainerd: error: %s\n", priority, logging.message().c_str());
    return 1;
  }
  return trainerd::daemon::Daemon(std::move(flags), std::move(*config)).Run();
}
