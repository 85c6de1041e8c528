// Length-prefixed frames: the transport of proto/trainerd.proto.
//
// A stream is a sequence of frames, each a 4-byte little-endian length N
// followed by N payload bytes (one serialized message), N <= kMaxFrameBytes.
// A length above the limit means the peer does not speak this framing or the
// stream is corrupt; it cannot be resynchronised, so the reader drops that
// connection.
//
// This file is byte-level and knows nothing of protobuf: it is torch-free and
// protobuf-free, so any target may use it. Turning messages into payloads and
// back (Serialize, ParseFrame) lives in common/proto_framing.h, which includes
// protobuf and so must stay out of torch translation units
// (shared/gpu/README.md, trap 1).
//
// Two ways to read:
//  - FrameDecoder, fed whatever bytes arrived: for an Asio read loop (the
//    daemon), or any code that owns its own reads;
//  - ReadFrame/WriteFrame on a blocking fd: for trainctl and trainerd-worker.
//
// Error messages say what was wrong with the stream but not which stream it
// was: callers add that with Status::WithContext ("job 7's worker", a socket path).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace trainerd {

// The largest payload a frame may carry: 16 MiB.
constexpr uint32_t kMaxFrameBytes = 16 << 20;
// Bytes of the length prefix.
constexpr size_t kFrameHeaderBytes = 4;

// Ok when a payload of `payload_bytes` fits a frame; else an error naming the size and the limit.
Status CheckFrameSize(size_t payload_bytes, size_t max_bytes = kMaxFrameBytes);

// The frame carrying `payload`: its length as 4 little-endian bytes, then the payload.
// Precondition (asserted): payload.size() <= kMaxFrameBytes; a caller that
// cannot guarantee it checks with CheckFrameSize first.
std::string EncodeFrame(std::string_view payload);

// Splits a byte stream into frame payloads. Not thread-safe; no I/O.
//
// Use: after each Feed, call Next until it returns nullopt (more bytes needed)
// or an error. Used that way the decoder holds at most one unfinished frame
// (<= 4 + max_frame_bytes bytes) plus the bytes of the last Feed beyond it, and
// an oversized length is refused as soon as its 4 bytes arrive, before any of
// the body is buffered. The first error is final: Next returns it again and
// Feed discards further input.
class FrameDecoder {
 public:
  explicit FrameDecoder(size_t max_frame_bytes = kMaxFrameBytes) : max_frame_bytes_(max_frame_bytes) {}

  // Appends `n` bytes read from the stream (copied; `data` may be reused at once).
  void Feed(const char* data, size_t n);

  // The payload of the next complete frame; nullopt when more bytes are needed;
  // an error when the next frame's declared length exceeds the limit.
  StatusOr<std::optional<std::string>> Next();

  // Call when the peer has closed the stream: ok when the bytes fed end at a
  // frame boundary, else "truncated frame: N of M bytes". Also returns an
  // earlier error of Next.
  Status AtEndOfStream() const;

  // Bytes fed but not yet returned by Next.
  size_t buffered_bytes() const { return buffer_.size() - consumed_; }

 private:
  size_t max_frame_bytes_;
  std::string buffer_;   // buffer_[consumed_..] is unread
  size_t consumed_ = 0;  // bytes of buffer_ already returned as frames
  Status error_;         // the first error of Next; final
};

// Writes one frame with `payload` to a blocking fd, retrying partial writes and
// EINTR. Never raises SIGPIPE: a socket is written with MSG_NOSIGNAL, and a
// pipe or other fd with SIGPIPE blocked in the calling thread for the write,
// so a closed peer is an error ("Broken pipe"). A payload over kMaxFrameBytes is
// an error and nothing is written. Frames from concurrent writers to one fd
// may interleave: one writer per fd at a time (or a lock).
Status WriteFrame(int fd, std::string_view payload);

// Reads one frame from a blocking fd, reading exactly its bytes (nothing of the
// next frame), retrying EINTR. Returns its payload; nullopt on end of file
// before the first byte of a frame; an error on end of file inside a frame
// ("truncated frame: N of M bytes"), on a declared length above `max_bytes`
// (refused before the body is read or allocated) and on a read error.
StatusOr<std::optional<std::string>> ReadFrame(int fd, size_t max_bytes = kMaxFrameBytes);

}  // namespace trainerd
