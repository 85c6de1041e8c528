#include "common/daemon_config.h"

#include <pwd.h>
#include <sys/un.h>
#include <unistd.h>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <utility>

#include "common/yaml_reader.h"

namespace trainerd {
namespace {

namespace fs = std::filesystem;

using yaml::Value;

// The longest socket path bind() takes: sun_path holds it and its terminating NUL.
constexpr size_t kMaxSocketPath = sizeof(sockaddr_un::sun_path) - 1;

// An absolute directory from a variable, or nullopt. Of a colon-separated list
// (systemd's StateDirectory=a b), the first.
std::optional<std::string> AbsoluteDirFrom(const EnvironmentView& env, const std::string& name) {
  std::optional<std::string> value = env.Get(name);
  if (!value) return std::nullopt;
  value = value->substr(0, value->find(':'));
  if (value->empty() || (*value)[0] != '/') return std::nullopt;
  return fs::path(*value).lexically_normal().string();
}

std::string Under(const std::string& dir, const std::string& child) {
  return yaml::ResolvePath(dir, child);
}

// $HOME, else the passwd entry's home folder, or "".
std::string HomeDir(const EnvironmentView& env, uid_t uid) {
  if (std::optional<std::string> home = AbsoluteDirFrom(env, "HOME")) return *home;
  long size = sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buffer(size > 0 ? static_cast<size_t>(size) : 16384);
  passwd entry{};
  passwd* result = nullptr;
  if (getpwuid_r(uid, &entry, buffer.data(), buffer.size(), &result) == 0 && result != nullptr &&
      result->pw_dir != nullptr && result->pw_dir[0] == '/') {
    return result->pw_dir;
  }
  return "";
}

const std::vector<std::string>& Keys() {
  static const std::vector<std::string> kKeys = {
      "socket", "state_dir", "gpus", "worker", "log_level", "stop_grace_seconds", "checkpoint_every"};
  return kKeys;
}

const yaml::Schema& ConfigSchema() {
  static const yaml::Schema kSchema = [] {
    yaml::Schema schema;
    schema.keys = Keys();
    // Names other daemons and the job spec use for the same things.
    schema.foreign_names = {
        {"socket_path", "socket"},          {"listen", "socket"},
        {"state_directory", "state_dir"},   {"data_dir", "state_dir"},
        {"worker_path", "worker"},          {"devices", "gpus"},
        {"device", "gpus"},                 {"log-level", "log_level"},
        {"loglevel", "log_level"},          {"stop_grace", "stop_grace_seconds"},
        {"save_steps", "checkpoint_every"},
    };
    return schema;
  }();
  return kSchema;
}

Status SetSocketPath(const Value& v, const std::string& base_dir, std::string* out) {
  std::string path;
  TRAINERD_RETURN_IF_ERROR(yaml::SetPath(v, base_dir, &path));
  if (path.size() > kMaxSocketPath) {
    return v.Error("'" + path + "' is " + std::to_string(path.size()) +
                   " bytes long; a unix socket path holds at most " +
                   std::to_string(kMaxSocketPath) + ": choose a shorter one");
  }
  *out = std::move(path);
  return Status::Ok();
}

// "cuda:N" with N a decimal GPU index.
bool IsCudaDevice(const std::string& name) {
  const std::string prefix = "cuda:";
  if (name.compare(0, prefix.size(), prefix) != 0 || name.size() == prefix.size()) return false;
  const std::string index = name.substr(prefix.size());
  if (!std::all_of(index.begin(), index.end(),
                   [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    return false;
  }
  int value = 0;
  return std::from_chars(index.data(), index.data() + index.size(), value).ec == std::errc();
}

Status SetGpus(const Value& v, std::vector<std::string>* out) {
  const YAML::Node& node = v.node();
  const std::string expected = "'all', or a list of GPUs such as [cuda:0, cuda:1], or [cpu]";
  if (node.IsScalar()) {
    if (node.Scalar() == "all") {
      out->clear();
      return Status::Ok();
    }
    if (node.Scalar() == "cpu" || IsCudaDevice(node.Scalar())) {
      return v.Expected(expected, " (write a list: [" + node.Scalar() + "])");
    }
    return v.Expected(expected);
  }
  if (!node.IsSequence()) return v.Expected(expected);
  if (node.size() == 0) {
    return v.Error("the list is empty; write 'gpus: all' for every GPU or 'gpus: [cpu]' for the CPU");
  }
  std::vector<std::string> gpus;
  for (const YAML::Node& item : node) {
    // Each entry reports at its own line: lists often span several.
    const Value entry(item, v.key(), v.source(), item.Mark());
    if (!item.IsScalar()) return entry.Expected("a GPU name (cuda:N or cpu)");
    const std::string& name = item.Scalar();
    if (name == "all") return entry.Error("'all' replaces the list: write 'gpus: all'");
    if (name != "cpu" && !IsCudaDevice(name)) {
      std::string message = "unknown GPU '" + name + "'; write cuda:N (N = the GPU's index) or cpu";
      const bool digits = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      });
      if (digits) message += " (did you mean 'cuda:" + name + "'?)";
      return entry.Error(message);
    }
    if (std::find(gpus.begin(), gpus.end(), name) != gpus.end()) {
      return entry.Error("'" + name + "' is listed twice");
    }
    gpus.push_back(name);
  }
  if (gpus.size() > 1 && std::find(gpus.begin(), gpus.end(), "cpu") != gpus.end()) {
    return v.Error("'cpu' cannot be combined with GPUs: write [cpu] alone to train on the CPU");
  }
  *out = std::move(gpus);
  return Status::Ok();
}

Status ReadKey(const Value& v, const std::string& base_dir, DaemonConfig* config) {
  const std::string& key = v.key();
  if (key == "socket") return SetSocketPath(v, base_dir, &config->socket_path);
  if (key == "state_dir") return yaml::SetPath(v, base_dir, &config->state_dir);
  if (key == "gpus") return SetGpus(v, &config->gpus);
  if (key == "worker") return yaml::SetPath(v, base_dir, &config->worker_path);
  if (key == "log_level") return yaml::SetString(v, DaemonLogLevels(), &config->log_level);
  if (key == "stop_grace_seconds") return yaml::SetInt(v, 1, &config->stop_grace_seconds);
  if (key == "checkpoint_every") return yaml::SetInt(v, 0, &config->checkpoint_every);
  return v.Error("no reader for this key");  // Keys() and this list are out of step
}

}  // namespace

std::optional<std::string> EnvironmentView::Get(const std::string& name) const {
  if (variables_) {
    const auto found = variables_->find(name);
    if (found == variables_->end() || found->second.empty()) return std::nullopt;
    return found->second;
  }
  const char* value = std::getenv(name.c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

bool operator==(const DaemonConfig& a, const DaemonConfig& b) {
  return a.socket_path == b.socket_path && a.state_dir == b.state_dir && a.gpus == b.gpus &&
         a.worker_path == b.worker_path && a.log_level == b.log_level &&
         a.stop_grace_seconds == b.stop_grace_seconds && a.checkpoint_every == b.checkpoint_every &&
         a.user_mode == b.user_mode;
}

const std::vector<std::string>& DaemonLogLevels() {
  static const std::vector<std::string> kLevels = {"trace", "debug", "info", "warn", "error"};
  return kLevels;
}

StatusOr<DaemonConfig> DefaultDaemonConfig(const EnvironmentView& env, uid_t uid,
                                           const std::string& binary_dir) {
  DaemonConfig config;
  config.worker_path = Under(binary_dir.empty() ? "." : binary_dir, "trainerd-worker");
  const std::optional<std::string> state_directory = AbsoluteDirFrom(env, "STATE_DIRECTORY");
  const std::optional<std::string> runtime_directory = AbsoluteDirFrom(env, "RUNTIME_DIRECTORY");

  if (uid == 0 || state_directory || runtime_directory) {
    config.user_mode = false;
    config.state_dir = state_directory.value_or("/var/lib/trainerd");
    config.socket_path = Under(runtime_directory.value_or("/run/trainerd"), "trainerd.sock");
  } else {
    config.user_mode = true;
    if (std::optional<std::string> state_home = AbsoluteDirFrom(env, "XDG_STATE_HOME")) {
      config.state_dir = Under(*state_home, "trainerd");
    } else {
      const std::string home = HomeDir(env, uid);
      if (home.empty()) {
        return Status::Error(
            "cannot find a folder for trainerd's state: neither XDG_STATE_HOME nor HOME is set and "
            "user " + std::to_string(uid) + " has no home folder in the passwd database; set "
            "XDG_STATE_HOME, or state_dir in the config file");
      }
      config.state_dir = Under(home, ".local/state/trainerd");
    }
    std::optional<std::string> runtime = AbsoluteDirFrom(env, "XDG_RUNTIME_DIR");
    if (!runtime) {
      const std::string fallback = "/run/user/" + std::to_string(uid);
      if (access(fallback.c_str(), W_OK) != 0) {
        return Status::Error(
            "cannot find a folder for trainerd's socket: XDG_RUNTIME_DIR is not set and " +
            fallback + " is not a writable folder (" + std::strerror(errno) +
            "); set XDG_RUNTIME_DIR (a login session normally does), or socket in the config file");
      }
      runtime = fallback;
    }
    config.socket_path = Under(*runtime, "trainerd/trainerd.sock");
  }
  if (config.socket_path.size() > kMaxSocketPath) {
    return Status::Error("the default socket path " + config.socket_path + " is " +
                         std::to_string(config.socket_path.size()) +
                         " bytes long; a unix socket path holds at most " +
                         std::to_string(kMaxSocketPath) +
                         ": set socket in the config file to a shorter one");
  }
  return config;
}

StatusOr<DaemonConfig> ParseDaemonConfigText(const std::string& text, const std::string& source,
                                             const std::string& base_dir, DaemonConfig defaults) {
  TRAINERD_ASSIGN_OR_RETURN(const std::vector<YAML::Node> documents,
                            yaml::LoadDocuments(text, source));
  if (documents.empty() || (documents.size() == 1 && documents[0].IsNull())) return defaults;
  if (documents.size() > 1) {
    return Status::Error(yaml::Where(source, documents[1].Mark()) +
                         "a second YAML document ('---'); the config file holds one map of keys");
  }
  const YAML::Node& root = documents[0];
  if (!root.IsMap()) {
    return Status::Error(yaml::Where(source, root.Mark()) +
                         "the trainerd config is a map of keys (socket:, state_dir:, gpus:, ...), "
                         "got " + yaml::Describe(root));
  }
  DaemonConfig config = std::move(defaults);
  yaml::MapReader reader(source, &ConfigSchema());
  try {
    TRAINERD_RETURN_IF_ERROR(reader.Read(
        root, "",
        [](const Value& v) { return v.Error("is not a section"); },  // the schema has none
        [&](const Value& v) { return ReadKey(v, base_dir, &config); }));
  } catch (const YAML::Exception& e) {
    return Status::Error(source + ": cannot read the YAML: " + e.what());
  }
  return config;
}

StatusOr<DaemonConfig> LoadDaemonConfig(const std::string& path, bool explicit_path,
                                        DaemonConfig defaults) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) {
    if (!explicit_path) return defaults;
    return Status::Error("config file " + path +
                         " does not exist; give the path of a trainerd config (.yaml) file, or "
                         "leave out --config to use the defaults");
  }
  if (status.type() == fs::file_type::directory) {
    return Status::Error(path + ": is a folder; give the path of a trainerd config (.yaml) file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status::Error("cannot open config file " + path + ": " + std::strerror(errno));
  }
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) {
    return Status::Error("cannot read config file " + path + ": " + std::strerror(errno));
  }
  const fs::path absolute = fs::absolute(path, ec);
  if (ec) {
    return Status::Error("cannot resolve the folder of config file " + path + ": " + ec.message());
  }
  return ParseDaemonConfigText(text, path, absolute.parent_path().lexically_normal().string(),
                               std::move(defaults));
}

}  // namespace trainerd
