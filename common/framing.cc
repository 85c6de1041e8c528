#include "common/framing.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <cassert>
#include <cstring>
#include <utility>

namespace trainerd {
namespace {

void PutLength(uint32_t n, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
}

uint32_t GetLength(const char* in) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return n;
}

Status OversizedError(uint64_t length, size_t max_bytes) {
  return Status::Error("frame length " + std::to_string(length) + " bytes exceeds the limit of " +
                       std::to_string(max_bytes) +
                       " bytes: the peer does not speak trainerd's framing or the stream is corrupt");
}

Status TruncatedHeaderError(size_t got) {
  return Status::Error("truncated frame header: " + std::to_string(got) + " of " +
                       std::to_string(kFrameHeaderBytes) + " bytes before end of stream");
}

Status TruncatedBodyError(size_t got, uint32_t length) {
  return Status::Error("truncated frame: " + std::to_string(got) + " of " + std::to_string(length) +
                       " bytes before end of stream");
}

Status ErrnoError(const char* what, int err) { return Status::Error(std::string(what) + ": " + std::strerror(err)); }

// Waits until `fd` is ready for `events`, for fds someone made non-blocking.
Status WaitReady(int fd, short events, const char* what) {
  pollfd p{fd, events, 0};
  while (::poll(&p, 1, -1) < 0) {
    if (errno != EINTR) return ErrnoError(what, errno);
  }
  return Status::Ok();
}

// Blocks SIGPIPE in the calling thread while it lives. A write to a pipe whose
// reader is gone then fails with EPIPE and leaves SIGPIPE pending for this
// thread; ConsumePending takes it so that it is not delivered when the old mask
// comes back. A SIGPIPE already pending before is left alone.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&sigpipe_);
    sigaddset(&sigpipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigpipe_, &old_mask_);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~ScopedSigpipeBlock() { pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr); }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

  void ConsumePending() {
    if (was_pending_) return;
    const timespec zero{0, 0};
    while (sigtimedwait(&sigpipe_, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }

 private:
  sigset_t sigpipe_;
  sigset_t old_mask_;
  bool was_pending_ = false;
};

// Writes all of `iov[0..count)`: sendmsg with MSG_NOSIGNAL on a socket,
// writev with SIGPIPE blocked on anything else.
Status WriteAll(int fd, iovec* iov, int count) {
  bool is_socket = true;  // until sendmsg says ENOTSOCK
  std::optional<ScopedSigpipeBlock> sigpipe_block;
  while (count > 0) {
    ssize_t n;
    if (is_socket) {
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(count);
      n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
      if (n < 0 && errno == ENOTSOCK) {
        is_socket = false;
        sigpipe_block.emplace();
        continue;
      }
    } else {
      n = ::writev(fd, iov, count);
    }
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        TRAINERD_RETURN_IF_ERROR(WaitReady(fd, POLLOUT, "writing a frame"));
        continue;
      }
      if (err == EPIPE && sigpipe_block) sigpipe_block->ConsumePending();
      return ErrnoError("writing a frame", err);
    }
    size_t written = static_cast<size_t>(n);
    while (count > 0 && written >= iov->iov_len) {
      written -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + written;
      iov->iov_len -= written;
    }
  }
  return Status::Ok();
}

// Reads up to `n` bytes into `out`, stopping early only at end of file.
// Returns the number of bytes read.
StatusOr<size_t> ReadUpTo(int fd, char* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, out + got, n - got);
    if (r == 0) break;
    if (r < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        TRAINERD_RETURN_IF_ERROR(WaitReady(fd, POLLIN, "reading a frame"));
        continue;
      }
      return ErrnoError("reading a frame", err);
    }
    got += static_cast<size_t>(r);
  }
  return got;
}

}  // namespace

Status CheckFrameSize(size_t payload_bytes, size_t max_bytes) {
  if (payload_bytes > max_bytes) {
    return Status::Error("a payload of " + std::to_string(payload_bytes) + " bytes exceeds the frame limit of " +
                         std::to_string(max_bytes) + " bytes");
  }
  return Status::Ok();
}

std::string EncodeFrame(std::string_view payload) {
  assert(payload.size() <= kMaxFrameBytes && "EncodeFrame: payload over kMaxFrameBytes");
  std::string frame(kFrameHeaderBytes + payload.size(), '\0');
  PutLength(static_cast<uint32_t>(payload.size()), frame.data());
  if (!payload.empty()) std::memcpy(frame.data() + kFrameHeaderBytes, payload.data(), payload.size());
  return frame;
}

void FrameDecoder::Feed(const char* data, size_t n) {
  if (!error_.ok() || n == 0) return;
  // Drop returned frames once they are most of the buffer: amortised O(1) per byte.
  if (consumed_ > 0 && consumed_ >= buffer_.size() / 2) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  buffer_.append(data, n);
}

StatusOr<std::optional<std::string>> FrameDecoder::Next() {
  if (!error_.ok()) return error_;
  const size_t available = buffer_.size() - consumed_;
  if (available < kFrameHeaderBytes) return std::optional<std::string>();
  const uint32_t length = GetLength(buffer_.data() + consumed_);
  if (length > max_frame_bytes_) {
    error_ = OversizedError(length, max_frame_bytes_);
    buffer_.clear();
    buffer_.shrink_to_fit();
    consumed_ = 0;
    return error_;
  }
  if (available - kFrameHeaderBytes < length) return std::optional<std::string>();
  std::string payload = buffer_.substr(consumed_ + kFrameHeaderBytes, length);
  consumed_ += kFrameHeaderBytes + length;
  if (consumed_ == buffer_.size()) {
    buffer_.clear();
    consumed_ = 0;
  }
  return std::optional<std::string>(std::move(payload));
}

Status FrameDecoder::AtEndOfStream() const {
  if (!error_.ok()) return error_;
  const size_t available = buffer_.size() - consumed_;
  if (available == 0) return Status::Ok();
  if (available < kFrameHeaderBytes) return TruncatedHeaderError(available);
  const uint32_t length = GetLength(buffer_.data() + consumed_);
  // Next has not seen this frame yet when the caller skipped it; say what it would.
  if (length > max_frame_bytes_) return OversizedError(length, max_frame_bytes_);
  const size_t body = available - kFrameHeaderBytes;
  if (body < length) return TruncatedBodyError(body, length);
  return Status::Error("end of stream with " + std::to_string(available) +
                       " bytes of complete frames not yet read by FrameDecoder::Next");
}

Status WriteFrame(int fd, std::string_view payload) {
  TRAINERD_RETURN_IF_ERROR(CheckFrameSize(payload.size()).WithContext("writing a frame"));
  char header[kFrameHeaderBytes];
  PutLength(static_cast<uint32_t>(payload.size()), header);
  iovec iov[2];
  iov[0].iov_base = header;
  iov[0].iov_len = sizeof header;
  iov[1].iov_base = const_cast<char*>(payload.data());
  iov[1].iov_len = payload.size();
  return WriteAll(fd, iov, payload.empty() ? 1 : 2);
}

StatusOr<std::optional<std::string>> ReadFrame(int fd, size_t max_bytes) {
  char header[kFrameHeaderBytes];
  TRAINERD_ASSIGN_OR_RETURN(const size_t header_got, ReadUpTo(fd, header, sizeof header));
  if (header_got == 0) return std::optional<std::string>();
  if (header_got < sizeof header) return TruncatedHeaderError(header_got);
  const uint32_t length = GetLength(header);
  if (length > max_bytes) return OversizedError(length, max_bytes);
  std::string payload(length, '\0');
  TRAINERD_ASSIGN_OR_RETURN(const size_t body_got, ReadUpTo(fd, payload.data(), length));
  if (body_got < length) return TruncatedBodyError(body_got, length);
  return std::optional<std::string>(std::move(payload));
}

}  // namespace trainerd
