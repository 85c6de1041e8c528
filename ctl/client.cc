#include "ctl/client.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "common/framing.h"
#include "common/proto_framing.h"

namespace trainerd::client {
namespace {

// What to do when no daemon answers on the socket.
constexpr char kStartHint[] =
    "is trainerd running? start it with `systemctl start trainerd` (the system service) or "
    "`trainerd &` (your own daemon); or point trainctl at its socket with --socket PATH or "
    "TRAINERD_SOCKET";
// What to do when no daemon answers on a socket the user named.
constexpr char kNamedSocketHint[] =
    "is trainerd running with this socket? see `socket:` in its config (/etc/trainerd/trainerd.yaml) "
    "and `systemctl status trainerd`, or start it with `trainerd &`; without --socket and "
    "TRAINERD_SOCKET trainctl finds the default daemons' sockets itself";

bool IsAbsolute(const std::string& path) { return !path.empty() && path[0] == '/'; }

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The hint for a socket we may not connect to.
std::string PermissionHint(const std::string& path) {
  return "the system daemon's socket is for root and members of the trainerd group: add yourself "
         "with `sudo usermod -aG trainerd $USER` and log in again; a user daemon's socket is for "
         "its user only; or run your own daemon (`trainerd &`) and use its socket (--socket or "
         "TRAINERD_SOCKET); check with `ls -l " +
         path + "`";
}

}  // namespace

SocketPath ResolveSocketPath(const std::string& flag, const EnvironmentView& env, uid_t uid) {
  if (!flag.empty()) return {flag, "from --socket", true};
  if (std::optional<std::string> from_env = env.Get(kSocketEnvVar)) {
    return {*from_env, std::string("from $") + kSocketEnvVar, true};
  }
  std::optional<std::string> runtime = env.Get("XDG_RUNTIME_DIR");
  std::string user_socket = (runtime && IsAbsolute(*runtime) ? *runtime : "/run/user/" + std::to_string(uid)) +
                            "/trainerd/trainerd.sock";
  if (Exists(user_socket)) return {user_socket, "the user daemon's socket", false};
  return {kSystemSocketPath, "the system daemon's socket", false};
}

proto::Reply::KindCase ReplyKindFor(proto::Request::KindCase request) {
  switch (request) {
    case proto::Request::kSubmit:
      return proto::Reply::kSubmit;
    case proto::Request::kList:
      return proto::Reply::kList;
    case proto::Request::kStatus:
      return proto::Reply::kStatus;
    case proto::Request::kCancel:
      return proto::Reply::kCancel;
    case proto::Request::kLogs:
      return proto::Reply::kLogs;
    case proto::Request::kWait:
      return proto::Reply::kWait;
    case proto::Request::kValidate:
      return proto::Reply::kValidate;
    case proto::Request::KIND_NOT_SET:
      break;
  }
  return proto::Reply::KIND_NOT_SET;
}

const char* RequestKindName(proto::Request::KindCase kind) {
  switch (kind) {
    case proto::Request::kSubmit:
      return "submit";
    case proto::Request::kList:
      return "list";
    case proto::Request::kStatus:
      return "status";
    case proto::Request::kCancel:
      return "cancel";
    case proto::Request::kLogs:
      return "logs";
    case proto::Request::kWait:
      return "wait";
    case proto::Request::kValidate:
      return "validate";
    case proto::Request::KIND_NOT_SET:
      break;
  }
  return "empty";
}

namespace {

// The name of a Reply's kind, for messages.
std::string ReplyKindName(proto::Reply::KindCase kind) {
  switch (kind) {
    case proto::Reply::kSubmit:
      return "a submit reply";
    case proto::Reply::kList:
      return "a list reply";
    case proto::Reply::kStatus:
      return "a status reply";
    case proto::Reply::kCancel:
      return "a cancel reply";
    case proto::Reply::kLogs:
      return "a logs reply";
    case proto::Reply::kWait:
      return "a wait reply";
    case proto::Reply::kValidate:
      return "a validate reply";
    case proto::Reply::KIND_NOT_SET:
      break;
  }
  return "an empty reply";
}

constexpr char kVersionHint[] = "are trainctl and trainerd the same version?";

}  // namespace

Connection::~Connection() { Close(); }

Connection::Connection(Connection&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), socket_(std::move(other.socket_)), failure_(other.failure_) {}

Connection& Connection::operator=(Connection&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    socket_ = std::move(other.socket_);
    failure_ = other.failure_;
  }
  return *this;
}

void Connection::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status Connection::Fail(Failure kind, Status status) {
  failure_ = kind;
  return status;
}

std::string Connection::Where() const {
  std::string where = "trainerd at " + socket_.path;
  if (!socket_.origin.empty()) where += " (" + socket_.origin + ")";
  return where;
}

Status Connection::Connect(const SocketPath& socket) {
  Close();
  socket_ = socket;
  failure_ = Failure::kNone;
  const std::string cannot = "cannot connect to " + Where();
  const std::string hint = socket.named_by_user ? kNamedSocketHint : kStartHint;
  sockaddr_un addr{};
  if (socket.path.empty()) {
    return Fail(Failure::kConnectFailed, Status::Error("cannot connect to trainerd: the socket path is empty; " +
                                                        std::string(kStartHint)));
  }
  if (socket.path.size() >= sizeof(addr.sun_path)) {
    return Fail(Failure::kConnectFailed,
                Status::Error(cannot + ": the path is " + std::to_string(socket.path.size()) +
                              " bytes long; a unix socket path holds at most " +
                              std::to_string(sizeof(addr.sun_path) - 1) + "; use a shorter one"));
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return Fail(Failure::kConnectFailed, Status::Error(cannot + ": socket: " + std::strerror(errno)));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket.path.data(), socket.path.size());
  int rc;
  do {
    rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    ::close(fd);
    switch (err) {
      case ENOENT:
        return Fail(Failure::kNoDaemon,
                    Status::Error(cannot + ": no such socket; " + hint));
      case ECONNREFUSED:
        return Fail(Failure::kNoDaemon,
                    Status::Error(cannot + ": nobody is listening on it (trainerd stopped or crashed?); " + hint));
      case EACCES:
      case EPERM:
        return Fail(Failure::kPermissionDenied,
                    Status::Error(cannot + ": permission denied; " + PermissionHint(socket.path)));
      default:
        return Fail(Failure::kConnectFailed, Status::Error(cannot + ": " + std::strerror(err)));
    }
  }
  fd_ = fd;
  return Status::Ok();
}

Status Connection::Send(const proto::Request& request) {
  if (fd_ < 0) {
    return Fail(Failure::kConnectionLost, Status::Error("not connected to trainerd; connect first"));
  }
  const std::string payload = Serialize(request);
  Status fits = CheckFrameSize(payload.size());
  if (!fits.ok()) {
    // Nothing was written: the connection is still usable.
    return Fail(Failure::kProtocol,
                fits.WithContext("a " + std::string(RequestKindName(request.kind_case())) + " request to " + Where()));
  }
  Status written = WriteFrame(fd_, payload);
  if (!written.ok()) {
    Close();
    return Fail(Failure::kConnectionLost,
                written.WithContext("sending a " + std::string(RequestKindName(request.kind_case())) +
                                    " request to " + Where()));
  }
  return Status::Ok();
}

StatusOr<proto::Reply> Connection::Receive(const std::string& what, bool mid_stream) {
  StatusOr<std::optional<std::string>> frame = ReadFrame(fd_);
  if (!frame.ok()) {
    Close();
    const std::string& message = frame.status().message();
    const bool oversized = message.find("exceeds the limit") != std::string::npos;
    if (oversized) {
      return Fail(Failure::kProtocol, Status::Error(Where() + " sent a bad frame in " + what + ": " + message +
                                                    "; " + kVersionHint));
    }
    return Fail(Failure::kConnectionLost,
                frame.status().WithContext("the connection to " + Where() + " broke during " + what));
  }
  if (!frame->has_value()) {
    Close();
    return Fail(Failure::kConnectionLost,
                Status::Error(Where() + " closed the connection " +
                              (mid_stream ? "before the end of " : "without sending ") + what +
                              " (did trainerd stop or crash? see `systemctl status trainerd` or its log)"));
  }
  proto::Reply reply;
  Status parsed = ParseFrame(**frame, &reply);
  if (!parsed.ok()) {
    Close();
    return Fail(Failure::kProtocol, Status::Error(Where() + " sent " + what + " that trainctl cannot read: " +
                                                  parsed.message() + "; " + kVersionHint));
  }
  return reply;
}

StatusOr<proto::Reply> Connection::Call(const proto::Request& request) {
  failure_ = Failure::kNone;
  TRAINERD_RETURN_IF_ERROR(Send(request));
  const std::string name = RequestKindName(request.kind_case());
  const std::string what = "the answer to a " + name + " request";
  TRAINERD_ASSIGN_OR_RETURN(proto::Reply reply, Receive(what, /*mid_stream=*/false));
  const proto::Reply::KindCase expected = ReplyKindFor(request.kind_case());
  if (reply.error().code() == proto::ERROR_CODE_NONE && reply.kind_case() != expected) {
    Close();
    return Fail(Failure::kProtocol, Status::Error(Where() + " answered a " + name + " request with " +
                                                  ReplyKindName(reply.kind_case()) + "; " + kVersionHint));
  }
  return reply;
}

Status Connection::Stream(const proto::Request& request, const ReplyCallback& on_reply) {
  failure_ = Failure::kNone;
  TRAINERD_RETURN_IF_ERROR(Send(request));
  const std::string name = RequestKindName(request.kind_case());
  const std::string what = "the answer to a " + name + " request";
  const proto::Reply::KindCase expected = ReplyKindFor(request.kind_case());
  for (bool first = true;; first = false) {
    TRAINERD_ASSIGN_OR_RETURN(proto::Reply reply, Receive(what, /*mid_stream=*/!first));
    const bool error = reply.error().code() != proto::ERROR_CODE_NONE;
    if (!error && reply.kind_case() != expected && reply.kind_case() != proto::Reply::KIND_NOT_SET) {
      Close();
      return Fail(Failure::kProtocol, Status::Error(Where() + " answered a " + name + " request with " +
                                                    ReplyKindName(reply.kind_case()) + "; " + kVersionHint));
    }
    on_reply(reply);
    if (error || reply.end_of_stream()) return Status::Ok();
  }
}

}  // namespace trainerd::client
