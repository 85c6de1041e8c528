// A blocking client connection to trainerd (proto/trainerd.proto over
// common/framing.h frames on a unix socket), and where to find its socket.
//
// Used by trainctl and by anything else that talks to the daemon the way users
// do (integration tests, the latency benchmark). It never prints: every
// failure comes back as a Status whose message names the socket path, says
// what went wrong and what to do, with a Failure saying which kind it was so a
// caller can choose an exit status. Errors that trainerd reports itself (a
// Reply whose error code is not ERROR_CODE_NONE) are answers, not failures:
// they come back as Replies.
//
// Threading: a Connection is used by one thread at a time.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>

#include "common/daemon_config.h"
#include "common/status.h"
#include "proto/trainerd.pb.h"

namespace trainerd::client {

// The environment variable that names trainerd's socket for trainctl.
inline constexpr char kSocketEnvVar[] = "TRAINERD_SOCKET";
// The system service's socket (systemd/trainerd.socket).
inline constexpr char kSystemSocketPath[] = "/run/trainerd/trainerd.sock";

// A socket path and where it came from, for messages.
struct SocketPath {
  std::string path;
  // How the path was chosen, e.g. "from --socket", "from $TRAINERD_SOCKET",
  // "the user daemon's socket", "the system daemon's socket"; may be empty.
  std::string origin;
  // True when the user named the path (--socket, $TRAINERD_SOCKET): messages
  // then suggest checking that path rather than starting the default daemon.
  bool named_by_user = false;
};

// The socket to connect to, first match wins: `flag` (--socket) when
// non-empty; $TRAINERD_SOCKET when set and non-empty; the user daemon's socket
// — $XDG_RUNTIME_DIR/trainerd/trainerd.sock, or /run/user/UID/trainerd/trainerd.sock
// when XDG_RUNTIME_DIR is unset or relative — when that file exists; else the
// system daemon's kSystemSocketPath. These are the paths trainerd itself
// listens on (common/daemon_config.h, DefaultDaemonConfig).
SocketPath ResolveSocketPath(const std::string& flag, const EnvironmentView& env, uid_t uid);

// What kind of failure the last call of a Connection had.
enum class Failure {
  kNone,
  // No daemon there: the socket file is missing (ENOENT) or nobody listens on it (ECONNREFUSED).
  kNoDaemon,
  // The socket refused us (EACCES, EPERM): not in its group, or another user's daemon.
  kPermissionDenied,
  // Any other error connecting (a path too long for a unix socket, ENOTDIR, ...).
  kConnectFailed,
  // The connection closed, or reading or writing it failed, before the answer ended
  // (including a frame cut short).
  kConnectionLost,
  // trainerd sent something that is not the expected answer: an oversized frame,
  // bytes that do not parse as a Reply, or a Reply of the wrong kind.
  kProtocol,
};

// The Reply kind that answers a Request kind: kSubmit → Reply::kSubmit, ...,
// kWait → Reply::kWait. KIND_NOT_SET for KIND_NOT_SET.
proto::Reply::KindCase ReplyKindFor(proto::Request::KindCase request);

// "submit", "list", "status", ..., "wait", for messages.
const char* RequestKindName(proto::Request::KindCase kind);

// One connection to trainerd. Requests on it are answered in order, one
// answer at a time, so a caller may send several requests one after another
// (e.g. LogsRequest{follow}, then WaitRequest) on the same connection.
class Connection {
 public:
  Connection() = default;
  ~Connection();  // Close()
  Connection(Connection&& other) noexcept;
  Connection& operator=(Connection&& other) noexcept;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects to the unix socket `socket.path`, closing any earlier connection.
  // Errors (Failure kNoDaemon, kPermissionDenied, kConnectFailed) name the path
  // and its origin and say what to do.
  Status Connect(const SocketPath& socket);
  Status Connect(const std::string& path) { return Connect(SocketPath{path, "", true}); }

  // Sends `request` and reads its one Reply. Not for the streamed answers
  // (LogsRequest{follow: true}, WaitRequest): use Stream. A Reply carrying an
  // error code is returned as is; a Reply without an error must be of the kind
  // that answers `request` (ReplyKindFor), else a kProtocol failure. Failures:
  // kConnectionLost (EOF, a truncated frame, a read or write error), kProtocol.
  StatusOr<proto::Reply> Call(const proto::Request& request);

  // Called with each Reply of a streamed answer, on the calling thread, as it arrives.
  using ReplyCallback = std::function<void(const proto::Reply&)>;

  // Sends `request` and reads Replies, passing each to `on_reply`, until one
  // that ends the answer, which is passed too: one with end_of_stream set, or
  // one carrying an error code (trainerd answers a request it refuses with a
  // single error Reply, streamed or not). Replies without an error must be of
  // the kind that answers `request` or carry no kind (the bare end_of_stream
  // Reply), else a kProtocol failure. Blocks as long as the stream lasts. A
  // connection closed before the answer ended is a kConnectionLost failure.
  Status Stream(const proto::Request& request, const ReplyCallback& on_reply);

  // The kind of the last failure of Connect, Call or Stream; kNone after a success.
  Failure failure() const { return failure_; }

  bool connected() const { return fd_ >= 0; }
  // The socket's fd, -1 when not connected (for poll() or tests).
  int fd() const { return fd_; }
  const SocketPath& socket() const { return socket_; }

  // Closes the connection; a later Call or Stream fails until Connect. Idempotent.
  void Close();

 private:
  // Records `kind` and returns `status` (an error).
  Status Fail(Failure kind, Status status);
  Status Send(const proto::Request& request);
  // Reads one Reply; `what` says what it answers, for messages.
  StatusOr<proto::Reply> Receive(const std::string& what, bool mid_stream);
  // The socket path and its origin, for messages: "trainerd at PATH (ORIGIN)".
  std::string Where() const;

  int fd_ = -1;
  SocketPath socket_;
  Failure failure_ = Failure::kNone;
};

}  // namespace trainerd::client
