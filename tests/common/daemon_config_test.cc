#include "common/daemon_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>

namespace trainerd {
namespace {

namespace fs = std::filesystem;

EnvironmentView Env(std::map<std::string, std::string> variables) {
  return EnvironmentView(std::move(variables));
}

// A uid with no /run/user folder and (almost surely) no passwd entry.
constexpr uid_t kStranger = 3999999;

DaemonConfig UserDefaults() {
  const StatusOr<DaemonConfig> config = DefaultDaemonConfig(
      Env({{"XDG_RUNTIME_DIR", "/run/user/1000"}, {"XDG_STATE_HOME", "/home/ada/.state"}}),
      1000, "/usr/bin");
  EXPECT_TRUE(config.ok()) << config.status().message();
  return config.ok() ? *config : DaemonConfig{};
}

StatusOr<DaemonConfig> Parse(const std::string& text) {
  return ParseDaemonConfigText(text, "trainerd.yaml", "/etc/trainerd", UserDefaults());
}

// Expects `text` to be rejected with a message holding every one of `parts`.
void ExpectError(const std::string& text, std::initializer_list<std::string> parts) {
  const StatusOr<DaemonConfig> config = Parse(text);
  ASSERT_FALSE(config.ok()) << "accepted:\n" << text;
  for (const std::string& part : parts) {
    EXPECT_NE(config.status().message().find(part), std::string::npos)
        << "message: " << config.status().message() << "\nlacks: " << part;
  }
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "daemon_config_test.XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string file = path_ + "/" + name;
    fs::create_directories(fs::path(file).parent_path());
    std::ofstream(file) << text;
    return file;
  }

 private:
  std::string path_;
};

TEST(DefaultDaemonConfigTest, UserModeFromXdgVariables) {
  const DaemonConfig config = UserDefaults();
  EXPECT_TRUE(config.user_mode);
  EXPECT_EQ(config.socket_path, "/run/user/1000/trainerd/trainerd.sock");
  EXPECT_EQ(config.state_dir, "/home/ada/.state/trainerd");
  EXPECT_EQ(config.worker_path, "/usr/bin/trainerd-worker");
  EXPECT_TRUE(config.gpus.empty());
  EXPECT_EQ(config.log_level, "info");
  EXPECT_EQ(config.stop_grace_seconds, 120);
  EXPECT_EQ(config.checkpoint_every, 0);
}

TEST(DefaultDaemonConfigTest, UserModeStateFallsBackToHome) {
  const StatusOr<DaemonConfig> config = DefaultDaemonConfig(
      Env({{"XDG_RUNTIME_DIR", "/run/user/1000"}, {"HOME", "/home/ada"}}), 1000,
      "/opt/trainerd/bin/");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->state_dir, "/home/ada/.local/state/trainerd");
  EXPECT_EQ(config->worker_path, "/opt/trainerd/bin/trainerd-worker");
}

TEST(DefaultDaemonConfigTest, RelativeXdgValuesAreIgnored) {
  const StatusOr<DaemonConfig> config = DefaultDaemonConfig(
      Env({{"XDG_RUNTIME_DIR", "/run/user/1000"},
                       {"XDG_STATE_HOME", "state"},
                       {"HOME", "/home/ada"}}),
      1000, "/usr/bin");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->state_dir, "/home/ada/.local/state/trainerd");
}

TEST(DefaultDaemonConfigTest, UserModeRuntimeFallsBackToRunUser) {
  const uid_t uid = getuid();
  if (uid == 0) GTEST_SKIP() << "root gets the system defaults";
  const std::string run_user = "/run/user/" + std::to_string(uid);
  const StatusOr<DaemonConfig> config =
      DefaultDaemonConfig(Env({{"HOME", "/home/ada"}}), uid, "/usr/bin");
  if (access(run_user.c_str(), W_OK) == 0) {
    ASSERT_TRUE(config.ok()) << config.status().message();
    EXPECT_EQ(config->socket_path, run_user + "/trainerd/trainerd.sock");
  } else {
    ASSERT_FALSE(config.ok());
    EXPECT_NE(config.status().message().find("set XDG_RUNTIME_DIR"), std::string::npos)
        << config.status().message();
  }
}

TEST(DefaultDaemonConfigTest, UserModeWithoutRuntimeFolderSaysWhatToSet) {
  const StatusOr<DaemonConfig> config =
      DefaultDaemonConfig(Env({{"HOME", "/home/ada"}}), kStranger, "/usr/bin");
  ASSERT_FALSE(config.ok());
  const std::string& message = config.status().message();
  EXPECT_NE(message.find("XDG_RUNTIME_DIR is not set"), std::string::npos) << message;
  EXPECT_NE(message.find("/run/user/3999999"), std::string::npos) << message;
  EXPECT_NE(message.find("set XDG_RUNTIME_DIR"), std::string::npos) << message;
}

TEST(DefaultDaemonConfigTest, UserModeWithoutHomeSaysWhatToSet) {
  const StatusOr<DaemonConfig> config = DefaultDaemonConfig(
      Env({{"XDG_RUNTIME_DIR", "/run/user/3999999"}}), kStranger, "/usr/bin");
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("set XDG_STATE_HOME"), std::string::npos)
      << config.status().message();
}

TEST(DefaultDaemonConfigTest, SystemModeForRoot) {
  // Root's XDG variables (sudo keeps some) do not move the system service.
  const StatusOr<DaemonConfig> config = DefaultDaemonConfig(
      Env({{"XDG_RUNTIME_DIR", "/run/user/0"}, {"HOME", "/root"}}), 0, "/usr/bin");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_FALSE(config->user_mode);
  EXPECT_EQ(config->socket_path, "/run/trainerd/trainerd.sock");
  EXPECT_EQ(config->state_dir, "/var/lib/trainerd");
  EXPECT_EQ(config->worker_path, "/usr/bin/trainerd-worker");
}

TEST(DefaultDaemonConfigTest, SystemModeFromSystemdDirectories) {
  // A service with User=trainerd, StateDirectory=trainerd, RuntimeDirectory=trainerd.
  const StatusOr<DaemonConfig> config = DefaultDaemonConfig(
      Env({{"STATE_DIRECTORY", "/var/lib/trainerd-gpu"},
                       {"RUNTIME_DIRECTORY", "/run/trainerd-gpu:/run/other"},
                       {"HOME", "/nonexistent"}}),
      998, "/usr/bin");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_FALSE(config->user_mode);
  EXPECT_EQ(config->state_dir, "/var/lib/trainerd-gpu");
  EXPECT_EQ(config->socket_path, "/run/trainerd-gpu/trainerd.sock");
}

TEST(DefaultDaemonConfigTest, SystemModeWithOnlyStateDirectory) {
  const StatusOr<DaemonConfig> config = DefaultDaemonConfig(
      Env({{"STATE_DIRECTORY", "/srv/trainerd"}}), 998, "/usr/bin");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_FALSE(config->user_mode);
  EXPECT_EQ(config->state_dir, "/srv/trainerd");
  EXPECT_EQ(config->socket_path, "/run/trainerd/trainerd.sock");
}

TEST(DaemonConfigTest, EmptyOrCommentOnlyTextGivesTheDefaults) {
  for (const std::string text : {"", "# nothing\n", "---\n"}) {
    const StatusOr<DaemonConfig> config = Parse(text);
    ASSERT_TRUE(config.ok()) << config.status().message();
    EXPECT_EQ(*config, UserDefaults()) << text;
  }
}

TEST(DaemonConfigTest, EveryKeyIsRead) {
  const StatusOr<DaemonConfig> config = Parse(R"(
socket: /tmp/t.sock
state_dir: /data/trainerd
gpus: [cuda:1, cuda:0]
worker: /opt/trainerd/trainerd-worker
log_level: debug
stop_grace_seconds: 300
checkpoint_every: 500
)");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->socket_path, "/tmp/t.sock");
  EXPECT_EQ(config->state_dir, "/data/trainerd");
  EXPECT_EQ(config->gpus, (std::vector<std::string>{"cuda:1", "cuda:0"}));
  EXPECT_EQ(config->worker_path, "/opt/trainerd/trainerd-worker");
  EXPECT_EQ(config->log_level, "debug");
  EXPECT_EQ(config->stop_grace_seconds, 300);
  EXPECT_EQ(config->checkpoint_every, 500);
  EXPECT_TRUE(config->user_mode);  // not a key: how trainerd runs
}

TEST(DaemonConfigTest, GpusAllAndCpu) {
  StatusOr<DaemonConfig> config = Parse("gpus: all\n");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_TRUE(config->gpus.empty());
  config = Parse("gpus:\n  - cpu\n");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->gpus, std::vector<std::string>{"cpu"});
}

TEST(DaemonConfigTest, BadGpus) {
  ExpectError("gpus: cuda:0\n", {"trainerd.yaml:1:", "gpus:", "write a list: [cuda:0]"});
  ExpectError("gpus: []\n", {"trainerd.yaml:1:", "gpus: all"});
  ExpectError("gpus:\n  - cuda:0\n  - 1\n", {"trainerd.yaml:3:", "unknown GPU '1'", "cuda:1"});
  ExpectError("gpus: [cuda:0, cuda:0]\n", {"trainerd.yaml:1:", "listed twice"});
  ExpectError("gpus: [cpu, cuda:0]\n", {"trainerd.yaml:1:", "'cpu' cannot be combined"});
  ExpectError("gpus: [all]\n", {"write 'gpus: all'"});
  ExpectError("gpus: {a: 1}\n", {"gpus: expected", "got a map"});
}

TEST(DaemonConfigTest, UnknownKeyWithSuggestionAndLine) {
  ExpectError("log_level: info\nstop_grace: 30\n",
              {"trainerd.yaml:2:", "unknown key 'stop_grace'", "did you mean 'stop_grace_seconds'?"});
  ExpectError("\n\nstate_dri: /x\n",
              {"trainerd.yaml:3:", "unknown key 'state_dri'", "did you mean 'state_dir'?"});
}

TEST(DaemonConfigTest, UnknownKeyWithoutSuggestionListsTheKeys) {
  ExpectError("colour: blue\n",
              {"trainerd.yaml:1:", "unknown key 'colour'",
               "the top level takes: socket, state_dir, gpus, worker, log_level, "
               "stop_grace_seconds, checkpoint_every"});
}

TEST(DaemonConfigTest, WrongTypes) {
  ExpectError("stop_grace_seconds: soon\n",
              {"trainerd.yaml:1:", "stop_grace_seconds: expected an integer, got 'soon'"});
  ExpectError("socket: [a, b]\n", {"trainerd.yaml:1:", "socket: expected a string, got a list"});
  ExpectError("checkpoint_every: 1.5\n", {"checkpoint_every: expected an integer"});
  ExpectError("log_level:\n", {"trainerd.yaml:1:", "log_level: has no value"});
}

TEST(DaemonConfigTest, BadLogLevel) {
  ExpectError("\nlog_level: warning\n",
              {"trainerd.yaml:2:", "log_level: unknown value 'warning'",
               "allowed: trace, debug, info, warn, error", "did you mean 'warn'?"});
}

TEST(DaemonConfigTest, NegativeOrZeroGrace) {
  ExpectError("stop_grace_seconds: -5\n",
              {"trainerd.yaml:1:", "stop_grace_seconds: must be >= 1, got -5"});
  ExpectError("stop_grace_seconds: 0\n", {"must be >= 1"});
  ExpectError("checkpoint_every: -1\n", {"checkpoint_every: must be >= 0, got -1"});
}

TEST(DaemonConfigTest, DuplicateKeysAndOtherShapes) {
  ExpectError("log_level: info\nlog_level: debug\n",
              {"trainerd.yaml:2:", "duplicate key 'log_level' (first set on line 1)"});
  ExpectError("- socket\n", {"trainerd.yaml:1:", "is a map of keys", "got a list"});
  ExpectError("log_level: info\n---\nlog_level: debug\n", {"trainerd.yaml:3:", "second YAML document"});
  ExpectError("log_level: [info\n", {"YAML syntax error"});
}

TEST(DaemonConfigTest, OverlongSocketPath) {
  ExpectError("socket: /" + std::string(120, 's') + "\n",
              {"trainerd.yaml:1:", "socket:", "at most 107"});
}

TEST(DaemonConfigTest, RelativePathsResolveAgainstTheFilesFolder) {
  TempDir dir;
  const std::string file = dir.Write("conf/trainerd.yaml",
                                     "socket: run/t.sock\nstate_dir: ../state/\nworker: ./bin/w\n");
  const StatusOr<DaemonConfig> config = LoadDaemonConfig(file, true, UserDefaults());
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->socket_path, dir.path() + "/conf/run/t.sock");
  EXPECT_EQ(config->state_dir, dir.path() + "/state");
  EXPECT_EQ(config->worker_path, dir.path() + "/conf/bin/w");
}

TEST(DaemonConfigTest, ErrorsNameTheFile) {
  TempDir dir;
  const std::string file = dir.Write("trainerd.yaml", "gpus: all\nlog_levl: info\n");
  const StatusOr<DaemonConfig> config = LoadDaemonConfig(file, false, UserDefaults());
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find(file + ":2: unknown key 'log_levl'; did you mean "
                                           "'log_level'?"),
            std::string::npos)
      << config.status().message();
}

TEST(DaemonConfigTest, MissingDefaultFileGivesTheDefaults) {
  TempDir dir;
  const StatusOr<DaemonConfig> config =
      LoadDaemonConfig(dir.path() + "/trainerd.yaml", false, UserDefaults());
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(*config, UserDefaults());
}

TEST(DaemonConfigTest, MissingExplicitFileIsAnError) {
  TempDir dir;
  const std::string file = dir.path() + "/trainerd.yaml";
  const StatusOr<DaemonConfig> config = LoadDaemonConfig(file, true, UserDefaults());
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("config file " + file + " does not exist"),
            std::string::npos)
      << config.status().message();
}

TEST(DaemonConfigTest, FolderIsAnError) {
  TempDir dir;
  const StatusOr<DaemonConfig> config = LoadDaemonConfig(dir.path(), false, UserDefaults());
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("is a folder"), std::string::npos)
      << config.status().message();
}

// The file the package installs sets nothing: every key is a comment with its default.
TEST(DaemonConfigTest, ShippedConfigLoadsAsTheDefaults) {
  const std::string shipped = std::string(TRAINERD_SOURCE_DIR) + "/etc/trainerd.yaml";
  for (const uid_t uid : {uid_t{0}, uid_t{1000}}) {
    const StatusOr<DaemonConfig> defaults = DefaultDaemonConfig(
        Env({{"XDG_RUNTIME_DIR", "/run/user/1000"}, {"HOME", "/home/ada"}}), uid,
        "/usr/bin");
    ASSERT_TRUE(defaults.ok()) << defaults.status().message();
    const StatusOr<DaemonConfig> config = LoadDaemonConfig(shipped, true, *defaults);
    ASSERT_TRUE(config.ok()) << config.status().message();
    EXPECT_EQ(*config, *defaults);
  }
}

// Every commented-out line of the shipped file, uncommented, is valid and sets
// what the struct's defaults say (socket and state_dir show the system values).
TEST(DaemonConfigTest, ShippedConfigUncommentedStatesTheDefaults) {
  std::ifstream in(std::string(TRAINERD_SOURCE_DIR) + "/etc/trainerd.yaml");
  ASSERT_TRUE(in);
  std::string line, uncommented;
  while (std::getline(in, line)) {
    // "#key: value" lines are settings; "# text" lines are prose.
    if (line.size() > 1 && line[0] == '#' && line[1] != ' ' && line[1] != '#') {
      uncommented += line.substr(1) + "\n";
    }
  }
  const StatusOr<DaemonConfig> system = DefaultDaemonConfig(Env({}), 0, "/usr/bin");
  ASSERT_TRUE(system.ok()) << system.status().message();
  DaemonConfig other;
  other.worker_path = "/elsewhere/trainerd-worker";
  const StatusOr<DaemonConfig> config =
      ParseDaemonConfigText(uncommented, "trainerd.yaml", "/etc/trainerd", other);
  ASSERT_TRUE(config.ok()) << config.status().message() << "\n" << uncommented;
  EXPECT_EQ(config->socket_path, system->socket_path);
  EXPECT_EQ(config->state_dir, system->state_dir);
  EXPECT_TRUE(config->gpus.empty());
  EXPECT_EQ(config->worker_path, system->worker_path);
  EXPECT_EQ(config->log_level, system->log_level);
  EXPECT_EQ(config->stop_grace_seconds, system->stop_grace_seconds);
  EXPECT_EQ(config->checkpoint_every, system->checkpoint_every);
}

}  // namespace
}  // namespace trainerd
