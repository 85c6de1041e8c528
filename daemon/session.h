// One client connection of the socket server (Asio's "connection").
//
// Reads bytes into a FrameDecoder, parses each frame as a proto::Request and
// hands it to the RequestHandler; Replies go out as frames through a queue, one
// async_write at a time. One answer at a time: the next Request is taken only
// once the current answer has ended, so answers come back in request order.
// While an answer is open the session keeps reading (to notice a peer that
// goes away during `logs -f`) until kPauseReadingBytes are buffered.
//
// A stream the session cannot trust — bytes that do not frame, an oversized
// length, a frame that is not a Request, a truncated frame at EOF — is logged
// (one line with the peer's pid and uid) and closes this connection only.
// A peer that half-closes (EOF at a frame boundary) gets its pending answers,
// then the connection closes.
//
// All members run on the io_context's thread. The session owns itself through
// shared_from_this() in its pending operations and ReplyWriter copies.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio.hpp>

#include "common/framing.h"
#include "daemon/request_handler.h"

namespace trainerd {

class Session : public std::enable_shared_from_this<Session> {
 public:
  using Socket = boost::asio::local::stream_protocol::socket;
  // Bytes buffered beyond the current frame above which reading pauses while
  // an answer is open.
  static constexpr size_t kPauseReadingBytes = 1 << 20;

  // `on_closed` runs once, on Close (the server drops the session from its list).
  // `handler` must outlive the session's use of it (until Close).
  Session(Socket socket, RequestHandler& handler, std::function<void(Session*)> on_closed);

  // Reads the peer's credentials and starts reading Requests.
  void Start();
  // Closes the socket, cancels pending operations and runs the open answer's
  // close callback. Idempotent.
  void Close();

  bool closed() const { return closed_; }
  const PeerCredentials& peer() const { return peer_; }

 private:
  friend class ReplyWriter;

  void DoRead();
  // Takes Requests from the decoder while no answer is open.
  void ProcessFrames();
  void DoWrite();
  // Queues `reply` for the answer `answer_id` (ignored unless it is the open one).
  void QueueReply(uint64_t answer_id, const proto::Reply& reply, bool ends_answer);
  // The same for a Reply already serialized (`end_of_stream`: what it says, for the error that
  // replaces a payload over the frame limit).
  void QueueSerializedReply(uint64_t answer_id, std::string payload, bool end_of_stream, bool ends_answer);
  bool AnswerOpen(uint64_t answer_id) const;
  void SetOnClose(uint64_t answer_id, std::function<void()> on_close);
  // Logs one line about this peer and closes the connection.
  void Fail(const std::string& what);
  // Closes once the peer has half-closed and everything it asked is answered and written.
  void CloseIfDone();

  Socket socket_;
  RequestHandler& handler_;
  std::function<void(Session*)> on_closed_;
  PeerCredentials peer_;
  FrameDecoder decoder_;
  char read_buffer_[64 * 1024];

  std::deque<std::string> write_queue_;  // frames; front() is being written
  bool writing_ = false;
  bool reading_ = false;
  bool peer_eof_ = false;  // the peer closed its side (at a frame boundary)
  bool processing_ = false;  // inside ProcessFrames (End called from Handle)
  bool closed_ = false;

  uint64_t answer_id_ = 0;      // the current or last answer
  bool answer_open_ = false;
  std::function<void()> on_close_;  // of the open answer
};

}  // namespace trainerd
