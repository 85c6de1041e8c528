// What the socket server (daemon/server.h) calls for each decoded Request.
//
// Threading: everything here runs on the thread running the server's
// io_context. A handler may answer at once (inside Handle) or later, from a
// completion handler or post() on the same io_context; it must not block.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "proto/trainerd.pb.h"

namespace trainerd {

class Session;

// The peer of a connection as the kernel saw it at connect time (SO_PEERCRED).
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// The answer to one Request: one Reply, or a stream of Replies ending with one
// that has `end_of_stream` set. A cheap, copyable handle: a handler that
// answers later keeps a copy, and the copy keeps the session alive (its socket
// may close meanwhile; see open() and OnClose).
//
// Requests on one connection are answered in order: the session reads the next
// Request only once this answer has ended (End or EndStream). A handler must
// therefore end every answer, or drop its copy when the connection closes.
//
// Calls after the answer has ended, or after the connection closed, do nothing.
class ReplyWriter {
 public:
  ReplyWriter(std::shared_ptr<Session> session, uint64_t answer_id);

  // Queues `reply` as part of a streamed answer; the answer stays open.
  void Send(const proto::Reply& reply);
  // Queues `reply` as the last (or only) Reply and ends the answer. The caller
  // sets end_of_stream when the answer is a stream.
  void End(const proto::Reply& reply);
  // Ends the answer with a Reply already serialized (a single Reply, not a
  // stream's last): for answers assembled from cached bytes.
  void EndSerialized(std::string payload);
  // Ends a streamed answer with a Reply that only has end_of_stream set.
  void EndStream();

  // True while the connection is open and this answer has not ended: a
  // streaming handler checks it before producing more.
  bool open() const;
  // Calls `on_close` once if the connection closes (the peer went away, an I/O
  // error, Server::Stop) while this answer is open; never after it ended.
  // Replaces an earlier callback. The callback runs on the I/O thread and may
  // drop the handler's copies of this writer.
  void OnClose(std::function<void()> on_close);

  const PeerCredentials& peer() const;

 private:
  std::shared_ptr<Session> session_;
  uint64_t answer_id_;
};

class RequestHandler {
 public:
  virtual ~RequestHandler() = default;
  // Called once per Request, in order per connection. `writer` is valid for
  // the call; copy it to answer later. An exception escaping Handle is logged
  // and, if the answer is still open, ends it with an ERROR_CODE_INTERNAL Reply.
  virtual void Handle(const proto::Request& request, const PeerCredentials& peer,
                      ReplyWriter& writer) = 0;
};

}  // namespace trainerd
