#include "ctl/daemon_call.h"

#include <cstdio>

#include "common/error_lines.h"
#include "ctl/exit_codes.h"

namespace trainerd::ctl {

int ReportError(int exit_code, const std::string& message) {
  std::fflush(stdout);  // keep what was printed before the error in order on a shared terminal
  PrintErrorLines("trainctl: error: ", message);
  return exit_code;
}

int ExitCodeForError(proto::ErrorCode code) {
  switch (code) {
    case proto::ERROR_CODE_NONE:
      return kExitOk;
    case proto::ERROR_CODE_BAD_REQUEST:
      return kExitRejected;
    case proto::ERROR_CODE_NOT_FOUND:
      return kExitNotFound;
    case proto::ERROR_CODE_PERMISSION_DENIED:
      return kExitPermissionDenied;
    case proto::ERROR_CODE_INTERNAL:
    default:
      return kExitInternal;
  }
}

int ExitCodeForFailure(client::Failure failure) {
  switch (failure) {
    case client::Failure::kNone:
      return kExitOk;
    case client::Failure::kPermissionDenied:
      return kExitPermissionDenied;
    case client::Failure::kNoDaemon:
    case client::Failure::kConnectFailed:
    case client::Failure::kConnectionLost:
    case client::Failure::kProtocol:
      break;
  }
  return kExitUnreachable;
}

int DaemonSession::ProtocolError(const std::string& message) {
  exit_code_ = ReportError(kExitUnreachable, message);
  return exit_code_;
}

bool DaemonSession::ReportFailure(const Status& status) {
  exit_code_ = ReportError(ExitCodeForFailure(connection_.failure()), status.message());
  return false;
}

bool DaemonSession::EnsureConnected() {
  if (connection_.connected()) return true;
  Status connected = connection_.Connect(socket_);
  return connected.ok() || ReportFailure(connected);
}

bool DaemonSession::CheckReply(const proto::Reply& reply) {
  const proto::ErrorCode code = reply.error().code();
  if (code == proto::ERROR_CODE_NONE) return true;
  std::string message = reply.error().message();
  if (message.empty()) {
    message = "trainerd refused the request (" + proto::ErrorCode_Name(code) + ") without saying why";
  }
  exit_code_ = ReportError(ExitCodeForError(code), message);
  return false;
}

std::optional<proto::Reply> DaemonSession::Call(const proto::Request& request) {
  if (!EnsureConnected()) return std::nullopt;
  StatusOr<proto::Reply> reply = connection_.Call(request);
  if (!reply.ok()) {
    ReportFailure(reply.status());
    return std::nullopt;
  }
  if (!CheckReply(*reply)) return std::nullopt;
  return std::move(reply).value();
}

std::optional<proto::Reply> DaemonSession::Stream(const proto::Request& request,
                                                  const client::Connection::ReplyCallback& on_reply) {
  if (!EnsureConnected()) return std::nullopt;
  std::optional<proto::Reply> last;
  Status streamed = connection_.Stream(request, [&](const proto::Reply& reply) {
    if (reply.error().code() == proto::ERROR_CODE_NONE) on_reply(reply);
    last = reply;
  });
  if (!streamed.ok()) {
    ReportFailure(streamed);
    return std::nullopt;
  }
  if (!last || !CheckReply(*last)) return std::nullopt;
  return last;
}

}  // namespace trainerd::ctl
