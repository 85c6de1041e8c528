#include "daemon/server.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

namespace trainerd {

namespace asio = boost::asio;
using Protocol = asio::local::stream_protocol;

namespace {

std::string Errno(int err) { return std::strerror(err); }

// Closes an fd at scope exit unless released.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

StatusOr<std::optional<int>> ListenFdFromSystemd() {
  int n = sd_listen_fds(/*unset_environment=*/1);
  if (n < 0) return Status::Error("reading the sockets systemd passed: " + Errno(-n));
  if (n == 0) return std::optional<int>();
  if (n > 1) {
    return Status::Error("systemd passed " + std::to_string(n) +
                         " sockets; trainerd.socket must have exactly one ListenStream=");
  }
  int fd = SD_LISTEN_FDS_START;
  int r = sd_is_socket_unix(fd, SOCK_STREAM, /*listening=*/1, nullptr, 0);
  if (r < 0) return Status::Error("checking the socket systemd passed: " + Errno(-r));
  if (r == 0) {
    return Status::Error(
        "the socket systemd passed is not a listening unix stream socket; check trainerd.socket's "
        "ListenStream=");
  }
  return std::optional<int>(fd);
}

Server::Server(asio::io_context& io, RequestHandler& handler)
    : io_(io), handler_(handler), acceptor_(io), retry_timer_(io) {}

Server::~Server() { Stop(); }

Status Server::Listen(const std::string& socket_path, mode_t mode) {
  if (stopped_ || acceptor_.is_open()) {
    return Status::Error("the server is already listening or was stopped");
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path)) {
    return Status::Error("socket path \"" + socket_path + "\" must have 1 to " +
                         std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);

  std::filesystem::path parent = std::filesystem::path(socket_path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) {
      return Status::Error("cannot create the socket's folder " + parent.string() + ": " +
                           ec.message());
    }
  }

  // Probe, remove and bind under a lock: without it two daemons could both
  // find a stale file, and the slower one would remove the faster one's socket.
  const std::string lock_path = socket_path + ".lock";
  FdCloser lock(open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (lock.get() < 0) return Status::Error("cannot open " + lock_path + ": " + Errno(errno));
  while (flock(lock.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return Status::Error("cannot lock " + lock_path + ": " + Errno(errno));
  }

  struct stat st {};
  if (lstat(socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status::Error(socket_path +
                           " exists and is not a socket; remove it or choose another socket path");
    }
    FdCloser probe(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (probe.get() < 0) return Status::Error("socket(): " + Errno(errno));
    if (connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      return Status::Error("another trainerd is listening on " + socket_path);
    }
    if (errno != ECONNREFUSED) {
      return Status::Error("cannot tell whether another trainerd is listening on " + socket_path +
                           ": connect: " + Errno(errno));
    }
    // A socket file nobody listens on: left by a daemon that died.
    if (unlink(socket_path.c_str()) != 0 && errno != ENOENT) {
      return Status::Error("cannot remove the stale socket " + socket_path + ": " + Errno(errno));
    }
  } else if (errno != ENOENT) {
    return Status::Error("cannot inspect " + socket_path + ": " + Errno(errno));
  }

  FdCloser fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Status::Error("socket(): " + Errno(errno));
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Status::Error("cannot bind " + socket_path + ": " + Errno(errno));
  }
  // Set the mode before listen(): until then a connect is refused, so nobody
  // gets in under the umask's looser mode.
  if (chmod(socket_path.c_str(), mode) != 0 || stat(socket_path.c_str(), &st) != 0) {
    int err = errno;
    unlink(socket_path.c_str());
    return Status::Error("cannot set the mode of " + socket_path + ": " + Errno(err));
  }
  if (listen(fd.get(), SOMAXCONN) != 0) {
    int err = errno;
    unlink(socket_path.c_str());
    return Status::Error("cannot listen on " + socket_path + ": " + Errno(err));
  }
  bound_path_ = socket_path;
  bound_dev_ = st.st_dev;
  bound_ino_ = st.st_ino;
  Status adopted = Adopt(fd.release());
  if (!adopted.ok()) {
    unlink(socket_path.c_str());
    bound_path_.clear();
  }
  return adopted.WithContext(socket_path);
}

Status Server::Adopt(int fd) {
  if (stopped_ || acceptor_.is_open()) {
    close(fd);
    return Status::Error("the server is already listening or was stopped");
  }
  boost::system::error_code ec;
  acceptor_.assign(Protocol(), fd, ec);
  if (ec) {
    close(fd);
    return Status::Error("cannot use the listening socket: " + ec.message());
  }
  DoAccept();
  return Status::Ok();
}

void Server::DoAccept() {
  std::weak_ptr<char> alive = alive_;
  acceptor_.async_accept([this, alive](const boost::system::error_code& ec,
                                       Protocol::socket socket) {
    if (alive.expired() || stopped_) return;
    if (ec) {
      // EMFILE and the like: retry after a pause rather than spin.
      spdlog::warn("accepting a connection: {}; retrying in 100 ms", ec.message());
      retry_timer_.expires_after(std::chrono::milliseconds(100));
      retry_timer_.async_wait([this, alive](const boost::system::error_code& wait_ec) {
        if (alive.expired() || wait_ec == asio::error::operation_aborted || stopped_) return;
        DoAccept();
      });
      return;
    }
    auto session = std::make_shared<Session>(std::move(socket), handler_,
                                             [this](Session* s) { sessions_.erase(s); });
    sessions_.emplace(session.get(), session);
    session->Start();
    DoAccept();
  });
}

void Server::Stop() {
  if (stopped_) return;
  stopped_ = true;
  boost::system::error_code ignored;
  retry_timer_.cancel();
  if (!bound_path_.empty()) {
    struct stat st {};
    if (lstat(bound_path_.c_str(), &st) == 0 && st.st_dev == bound_dev_ &&
        st.st_ino == bound_ino_) {
      unlink(bound_path_.c_str());
    }
  }
  acceptor_.close(ignored);
  std::vector<std::shared_ptr<Session>> sessions;
  sessions.reserve(sessions_.size());
  for (auto& [ptr, session] : sessions_) sessions.push_back(session);
  for (auto& session : sessions) session->Close();
  sessions_.clear();
}

}  // namespace trainerd
