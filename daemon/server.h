// The daemon's unix socket server (Asio's "server" + "connection_manager").
//
// Accepts connections on a listening unix stream socket — bound by Listen, or
// passed by systemd and taken with Adopt — and runs one Session per connection
// (daemon/session.h), each handing its Requests to the RequestHandler.
//
// Threading: construct, Listen/Adopt and Stop on the thread that runs (or will
// run) the io_context, or before it runs; the server does its work in that
// io_context's handlers.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include <boost/asio.hpp>

#include "common/status.h"
#include "daemon/request_handler.h"
#include "daemon/session.h"

namespace trainerd {

// The listening socket systemd passed (trainerd.socket): nullopt when started
// without socket activation; an error when systemd passed more than one fd or
// one that is not a listening unix stream socket. Unsets $LISTEN_FDS & co.
StatusOr<std::optional<int>> ListenFdFromSystemd();

class Server {
 public:
  // `io` and `handler` must outlive the server.
  Server(boost::asio::io_context& io, RequestHandler& handler);
  ~Server();  // Stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds `socket_path`, creating its folder (umask mode) if needed, gives the socket
  // file `mode` and starts accepting. A socket file left by a dead daemon
  // (connecting to it is refused) is replaced; a live one is an error
  // ("another trainerd is listening on PATH"), as is a path that exists and is
  // not a socket. The check, removal and bind run under flock(2) on
  // "PATH.lock" (created once, never removed), so two daemons starting at once
  // cannot remove each other's fresh socket.
  Status Listen(const std::string& socket_path, mode_t mode);

  // Takes an already listening unix stream socket (from systemd) and starts
  // accepting on it. The server owns `fd` from then on, even on error.
  Status Adopt(int fd);

  // Stops accepting, closes every open connection (their peers see EOF) and
  // removes the socket file that Listen created, if it is still ours.
  // Idempotent.
  void Stop();

  // Open connections (for tests and status).
  size_t session_count() const { return sessions_.size(); }

 private:
  void DoAccept();

  boost::asio::io_context& io_;
  RequestHandler& handler_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  boost::asio::steady_timer retry_timer_;  // after an accept error such as EMFILE
  std::unordered_map<Session*, std::shared_ptr<Session>> sessions_;
  bool stopped_ = false;
  // Expires with the server: accept and timer handlers that complete after the
  // server is gone (the io_context still running) check it before touching `this`.
  std::shared_ptr<char> alive_ = std::make_shared<char>();
  // The socket file Listen bound (empty after Adopt), and its identity, so
  // Stop removes it only if nobody has replaced it.
  std::string bound_path_;
  dev_t bound_dev_ = 0;
  ino_t bound_ino_ = 0;
};

}  // namespace trainerd
