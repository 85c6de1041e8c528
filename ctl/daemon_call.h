// trainctl's side of a conversation with trainerd: a client::Connection whose
// failures, and trainerd's error Replies, are reported on stderr as
// "trainctl: error: ..." and turned into trainctl's exit statuses
// (ctl/exit_codes.h).
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "ctl/client.h"
#include "proto/trainerd.pb.h"

namespace trainerd::ctl {

// Prints "trainctl: error: MESSAGE" on stderr, a line for each line of MESSAGE
// (a spec's errors come one a line), and returns `exit_code`.
int ReportError(int exit_code, const std::string& message);

// The exit status for an error code in a Reply: BAD_REQUEST → kExitRejected,
// NOT_FOUND → kExitNotFound, PERMISSION_DENIED → kExitPermissionDenied,
// INTERNAL and codes this trainctl does not know → kExitInternal; NONE → kExitOk.
int ExitCodeForError(proto::ErrorCode code);

// The exit status for a transport failure: kPermissionDenied →
// kExitPermissionDenied, any other failure → kExitUnreachable; kNone → kExitOk.
int ExitCodeForFailure(client::Failure failure);

// One connection to trainerd, made at the first request. Not thread-safe.
class DaemonSession {
 public:
  explicit DaemonSession(client::SocketPath socket) : socket_(std::move(socket)) {}

  // The Reply to `request` when trainerd answered it without an error;
  // otherwise nullopt, after reporting the failure or trainerd's error (see
  // exit_code()).
  std::optional<proto::Reply> Call(const proto::Request& request);

  // Streams the answer to `request`, passing each Reply without an error to
  // `on_reply` (the last one too), and returns that last Reply (end_of_stream
  // set). nullopt after reporting a failure or trainerd's error.
  std::optional<proto::Reply> Stream(const proto::Request& request,
                                     const client::Connection::ReplyCallback& on_reply);

  // The exit status of the last failure reported; kExitOk when none.
  int exit_code() const { return exit_code_; }

  // Reports a failure of trainctl's own making (e.g. a reply missing what it
  // must carry) as an unreachable-daemon protocol error; returns its exit status.
  int ProtocolError(const std::string& message);

 private:
  bool EnsureConnected();
  // Reports a transport failure of connection_; false.
  bool ReportFailure(const Status& status);
  // Reports an error Reply; false. True when `reply` carries no error.
  bool CheckReply(const proto::Reply& reply);

  client::SocketPath socket_;
  client::Connection connection_;
  int exit_code_ = 0;
};

}  // namespace trainerd::ctl
