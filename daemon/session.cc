#include "daemon/session.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <exception>
#include <utility>

#include <spdlog/spdlog.h>

#include "common/proto_framing.h"

namespace trainerd {

namespace asio = boost::asio;

// ---- ReplyWriter ----

ReplyWriter::ReplyWriter(std::shared_ptr<Session> session, uint64_t answer_id)
    : session_(std::move(session)), answer_id_(answer_id) {}

void ReplyWriter::Send(const proto::Reply& reply) { session_->QueueReply(answer_id_, reply, false); }

void ReplyWriter::End(const proto::Reply& reply) { session_->QueueReply(answer_id_, reply, true); }

void ReplyWriter::EndSerialized(std::string payload) {
  session_->QueueSerializedReply(answer_id_, std::move(payload), /*end_of_stream=*/false, /*ends_answer=*/true);
}

void ReplyWriter::EndStream() {
  proto::Reply reply;
  reply.set_end_of_stream(true);
  End(reply);
}

bool ReplyWriter::open() const { return session_->AnswerOpen(answer_id_); }

void ReplyWriter::OnClose(std::function<void()> on_close) {
  session_->SetOnClose(answer_id_, std::move(on_close));
}

const PeerCredentials& ReplyWriter::peer() const { return session_->peer(); }

// ---- Session ----

Session::Session(Socket socket, RequestHandler& handler, std::function<void(Session*)> on_closed)
    : socket_(std::move(socket)), handler_(handler), on_closed_(std::move(on_closed)) {}

void Session::Start() {
  struct ucred cred {};
  socklen_t len = sizeof(cred);
  if (getsockopt(socket_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    peer_.pid = cred.pid;
    peer_.uid = cred.uid;
    peer_.gid = cred.gid;
  } else {
    // Without credentials no request can be authorised: refuse the connection.
    Fail(std::string("cannot read the peer's credentials (SO_PEERCRED): ") + std::strerror(errno));
    return;
  }
  DoRead();
}

void Session::Fail(const std::string& what) {
  spdlog::warn("connection from pid {} uid {}: {}; closing it", peer_.pid, peer_.uid, what);
  Close();
}

void Session::Close() {
  if (closed_) return;
  auto self = shared_from_this();  // on_closed_ may drop the server's reference
  closed_ = true;
  boost::system::error_code ignored;
  socket_.shutdown(Socket::shutdown_both, ignored);
  socket_.close(ignored);
  write_queue_.clear();
  std::function<void()> on_close = std::move(on_close_);
  on_close_ = nullptr;
  answer_open_ = false;
  if (on_close) on_close();
  if (on_closed_) {
    auto on_closed = std::move(on_closed_);
    on_closed_ = nullptr;
    on_closed(this);
  }
}

void Session::DoRead() {
  if (closed_ || reading_ || peer_eof_) return;
  // While an answer is open, read only to notice the peer going away and to
  // buffer a little of what it pipelines.
  if (answer_open_ && decoder_.buffered_bytes() >= kPauseReadingBytes) return;
  reading_ = true;
  socket_.async_read_some(
      asio::buffer(read_buffer_),
      [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
        self->reading_ = false;
        if (self->closed_) return;
        if (ec == asio::error::eof) {
          // EOF is a half-close (answers still go out) unless the peer has
          // closed both directions (POLLHUP): then nobody reads the answers,
          // and a streaming handler should learn of it now.
          struct pollfd p {};
          p.fd = self->socket_.native_handle();
          p.events = POLLIN;
          if (poll(&p, 1, 0) == 1 && (p.revents & POLLHUP)) {
            self->Close();
            return;
          }
          self->peer_eof_ = true;
          self->ProcessFrames();
          return;
        }
        if (ec) {
          spdlog::debug("connection from pid {} uid {}: read: {}", self->peer_.pid, self->peer_.uid,
                        ec.message());
          self->Close();
          return;
        }
        self->decoder_.Feed(self->read_buffer_, n);
        self->ProcessFrames();
      });
}

void Session::ProcessFrames() {
  if (processing_) return;  // the outer call's loop goes on
  auto self = shared_from_this();
  processing_ = true;
  while (!closed_ && !answer_open_) {
    auto next = decoder_.Next();
    if (!next.ok()) {
      processing_ = false;
      Fail(next.status().message());
      return;
    }
    if (!next->has_value()) break;
    proto::Request request;
    Status parsed = ParseFrame(**next, &request);
    if (!parsed.ok()) {
      processing_ = false;
      Fail(parsed.message());
      return;
    }
    answer_open_ = true;
    ++answer_id_;
    const uint64_t answer_id = answer_id_;
    ReplyWriter writer(self, answer_id);
    try {
      handler_.Handle(request, peer_, writer);
    } catch (const std::exception& e) {
      spdlog::error("connection from pid {} uid {}: the request handler failed: {}", peer_.pid,
                    peer_.uid, e.what());
      if (AnswerOpen(answer_id)) {
        proto::Reply reply;
        reply.mutable_error()->set_code(proto::ERROR_CODE_INTERNAL);
        reply.mutable_error()->set_message(std::string("internal error: ") + e.what());
        reply.set_end_of_stream(true);
        writer.End(reply);
      }
    }
  }
  processing_ = false;
  if (closed_) return;
  if (peer_eof_) {
    Status at_end = decoder_.AtEndOfStream();
    if (!at_end.ok()) {
      Fail(at_end.message());
      return;
    }
    CloseIfDone();
    return;
  }
  DoRead();
}

void Session::CloseIfDone() {
  if (peer_eof_ && !answer_open_ && !writing_ && write_queue_.empty() &&
      decoder_.buffered_bytes() == 0) {
    Close();
  }
}

bool Session::AnswerOpen(uint64_t answer_id) const {
  return !closed_ && answer_open_ && answer_id == answer_id_;
}

void Session::SetOnClose(uint64_t answer_id, std::function<void()> on_close) {
  if (AnswerOpen(answer_id)) on_close_ = std::move(on_close);
}

void Session::QueueReply(uint64_t answer_id, const proto::Reply& reply, bool ends_answer) {
  if (!AnswerOpen(answer_id)) return;
  QueueSerializedReply(answer_id, Serialize(reply), reply.end_of_stream(), ends_answer);
}

void Session::QueueSerializedReply(uint64_t answer_id, std::string payload, bool end_of_stream, bool ends_answer) {
  if (!AnswerOpen(answer_id)) return;
  if (Status fits = CheckFrameSize(payload.size()); !fits.ok()) {
    spdlog::error("connection from pid {} uid {}: reply dropped: {}", peer_.pid, peer_.uid,
                  fits.message());
    proto::Reply error;
    error.mutable_error()->set_code(proto::ERROR_CODE_INTERNAL);
    error.mutable_error()->set_message("internal error: the reply is too large (" +
                                       fits.message() + ")");
    error.set_end_of_stream(end_of_stream);
    payload = Serialize(error);
  }
  write_queue_.push_back(EncodeFrame(payload));
  if (ends_answer) {
    answer_open_ = false;
    on_close_ = nullptr;
  }
  DoWrite();
  // The next request may be waiting in the decoder (a no-op when called from
  // inside Handle: that loop goes on).
  if (ends_answer) ProcessFrames();
}

void Session::DoWrite() {
  if (closed_ || writing_ || write_queue_.empty()) return;
  writing_ = true;
  asio::async_write(socket_, asio::buffer(write_queue_.front()),
                    [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                      self->writing_ = false;
                      if (self->closed_) return;
                      if (ec) {
                        spdlog::debug("connection from pid {} uid {}: write: {}", self->peer_.pid,
                                      self->peer_.uid, ec.message());
                        self->Close();
                        return;
                      }
                      self->write_queue_.pop_front();
                      if (!self->write_queue_.empty()) {
                        self->DoWrite();
                      } else {
                        self->CloseIfDone();
                      }
                    });
}

}  // namespace trainerd
