#include "common/framing.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/proto_framing.h"
#include "proto/trainerd.pb.h"

namespace trainerd {
namespace {

// Expects an error whose message holds every one of `parts`.
void ExpectError(const Status& status, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(status.ok()) << "expected an error";
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "message: " << status.message() << "\nlacks: " << part;
  }
}

// A payload of `n` bytes that differs from frame to frame and byte to byte.
std::string Payload(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + static_cast<size_t>(seed) * 7) & 0xff);
  return s;
}

// The 4-byte little-endian length prefix alone.
std::string Header(uint32_t n) {
  return std::string{static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff),
                     static_cast<char>((n >> 16) & 0xff), static_cast<char>((n >> 24) & 0xff)};
}

void Feed(FrameDecoder& decoder, const std::string& bytes) { decoder.Feed(bytes.data(), bytes.size()); }

// Every frame the decoder holds now; fails the test on an error.
std::vector<std::string> Drain(FrameDecoder& decoder) {
  std::vector<std::string> frames;
  for (;;) {
    StatusOr<std::optional<std::string>> next = decoder.Next();
    EXPECT_TRUE(next.ok()) << next.status().message();
    if (!next.ok() || !next->has_value()) return frames;
    frames.push_back(std::move(**next));
  }
}

const std::vector<std::string> kFrames = {"first", "", Payload(300, 1), std::string(1, '\0'), Payload(70000, 2)};

std::string EncodeAll(const std::vector<std::string>& frames) {
  std::string stream;
  for (const std::string& f : frames) stream += EncodeFrame(f);
  return stream;
}

// Two connected fds, closed on destruction: [0] reads, [1] writes.
struct FdPair {
  int fd[2] = {-1, -1};
  ~FdPair() {
    CloseRead();
    CloseWrite();
  }
  void CloseRead() {
    if (fd[0] >= 0) ::close(fd[0]);
    fd[0] = -1;
  }
  void CloseWrite() {
    if (fd[1] >= 0) ::close(fd[1]);
    fd[1] = -1;
  }
  int read_fd() const { return fd[0]; }
  int write_fd() const { return fd[1]; }
};

FdPair MakeSocketPair() {
  FdPair p;
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p.fd), 0) << std::strerror(errno);
  return p;
}

FdPair MakePipe() {
  FdPair p;
  EXPECT_EQ(::pipe2(p.fd, O_CLOEXEC), 0) << std::strerror(errno);
  return p;
}

// Writes raw bytes (not a frame) to `fd`.
void WriteRaw(int fd, const std::string& bytes) {
  ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
}

// ---- FrameDecoder ----

TEST(FrameDecoderTest, RoundTripFedInOneChunk) {
  FrameDecoder decoder;
  Feed(decoder, EncodeAll(kFrames));
  EXPECT_EQ(Drain(decoder), kFrames);
  EXPECT_EQ(decoder.buffered_bytes(), 0u);
  EXPECT_TRUE(decoder.AtEndOfStream().ok());
}

TEST(FrameDecoderTest, RoundTripFedByteByByte) {
  FrameDecoder decoder;
  std::vector<std::string> got;
  for (char c : EncodeAll(kFrames)) {
    decoder.Feed(&c, 1);
    for (std::string& f : Drain(decoder)) got.push_back(std::move(f));
  }
  EXPECT_EQ(got, kFrames);
  EXPECT_TRUE(decoder.AtEndOfStream().ok());
}

TEST(FrameDecoderTest, EmptyPayloadIsAFrame) {
  EXPECT_EQ(EncodeFrame(""), Header(0));
  FrameDecoder decoder;
  Feed(decoder, EncodeFrame(""));
  StatusOr<std::optional<std::string>> next = decoder.Next();
  ASSERT_TRUE(next.ok()) << next.status().message();
  ASSERT_TRUE(next->has_value());
  EXPECT_EQ(**next, "");
}

TEST(FrameDecoderTest, LengthIsLittleEndian) {
  EXPECT_EQ(EncodeFrame(Payload(0x0201, 3)).substr(0, 4), std::string("\x01\x02\x00\x00", 4));
}

TEST(FrameDecoderTest, PartialFrameWaitsForMoreBytes) {
  const std::string frame = EncodeFrame("hello");
  FrameDecoder decoder;
  Feed(decoder, frame.substr(0, 6));
  StatusOr<std::optional<std::string>> next = decoder.Next();
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->has_value());
  Feed(decoder, frame.substr(6));
  EXPECT_EQ(Drain(decoder), std::vector<std::string>{"hello"});
}

TEST(FrameDecoderTest, FrameOfExactlyMaxBytesIsAccepted) {
  const std::string payload = Payload(kMaxFrameBytes, 4);
  FrameDecoder decoder;
  Feed(decoder, EncodeFrame(payload));
  const std::vector<std::string> frames = Drain(decoder);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_TRUE(frames[0] == payload);
}

TEST(FrameDecoderTest, LengthOverMaxIsRefusedFromTheHeaderAlone) {
  FrameDecoder decoder;
  Feed(decoder, Header(kMaxFrameBytes + 1));  // no body at all
  StatusOr<std::optional<std::string>> next = decoder.Next();
  ExpectError(next.status(), {"frame length 16777217 bytes", "limit of 16777216 bytes"});
  EXPECT_EQ(decoder.buffered_bytes(), 0u);
}

TEST(FrameDecoderTest, ErrorIsFinal) {
  FrameDecoder decoder;
  Feed(decoder, Header(kMaxFrameBytes + 1));
  ASSERT_FALSE(decoder.Next().ok());
  Feed(decoder, EncodeFrame("valid"));  // discarded: the stream cannot be resynchronised
  EXPECT_EQ(decoder.buffered_bytes(), 0u);
  ExpectError(decoder.Next().status(), {"frame length 16777217 bytes"});
  ExpectError(decoder.AtEndOfStream(), {"frame length 16777217 bytes"});
}

TEST(FrameDecoderTest, SmallerLimitIsHonoured) {
  FrameDecoder decoder(10);
  Feed(decoder, EncodeFrame(Payload(10, 5)) + EncodeFrame(Payload(11, 6)));
  StatusOr<std::optional<std::string>> first = decoder.Next();
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->has_value());
  ExpectError(decoder.Next().status(), {"frame length 11 bytes", "limit of 10 bytes"});
}

TEST(FrameDecoderTest, GarbagePrefixIsRefused) {
  // A peer speaking something else: "GET " reads as a length of 542393671.
  {
    FrameDecoder decoder;
    Feed(decoder, "GET / HTTP/1.1\r\n");
    ExpectError(decoder.Next().status(), {"frame length 542393671 bytes", "does not speak"});
  }
  // Random prefixes with the top bit set: lengths of 2 GiB and more.
  std::mt19937 rng(20261202);
  for (int i = 0; i < 100; ++i) {
    std::string prefix(4, '\0');
    for (char& c : prefix) c = static_cast<char>(rng() & 0xff);
    prefix[3] = static_cast<char>(prefix[3] | 0x80);
    FrameDecoder decoder;
    Feed(decoder, prefix + "trailing garbage");
    StatusOr<std::optional<std::string>> next = decoder.Next();
    ExpectError(next.status(), {"exceeds the limit"});
    EXPECT_EQ(decoder.buffered_bytes(), 0u);
  }
}

TEST(FrameDecoderTest, TruncatedFrameAtEndOfStream) {
  FrameDecoder decoder;
  Feed(decoder, EncodeFrame("complete") + EncodeFrame(Payload(10, 7)).substr(0, 4 + 3));
  EXPECT_EQ(Drain(decoder), std::vector<std::string>{"complete"});
  ExpectError(decoder.AtEndOfStream(), {"truncated frame: 3 of 10 bytes"});
}

TEST(FrameDecoderTest, TruncatedHeaderAtEndOfStream) {
  FrameDecoder decoder;
  Feed(decoder, Header(5).substr(0, 2));
  EXPECT_EQ(Drain(decoder), std::vector<std::string>{});
  ExpectError(decoder.AtEndOfStream(), {"truncated frame header: 2 of 4 bytes"});
}

// ---- WriteFrame / ReadFrame on fds ----

// Writes kFrames to `pair` and reads them back, then a clean end of file.
void RoundTripOver(FdPair& pair) {
  std::thread writer([&] {
    for (const std::string& f : kFrames) {
      const Status status = WriteFrame(pair.write_fd(), f);
      EXPECT_TRUE(status.ok()) << status.message();
    }
    pair.CloseWrite();
  });
  for (const std::string& expected : kFrames) {
    StatusOr<std::optional<std::string>> got = ReadFrame(pair.read_fd());
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_TRUE(got->has_value());
    EXPECT_EQ(**got, expected);
  }
  StatusOr<std::optional<std::string>> eof = ReadFrame(pair.read_fd());
  ASSERT_TRUE(eof.ok()) << eof.status().message();
  EXPECT_FALSE(eof->has_value());
  writer.join();
}

TEST(FdFramingTest, RoundTripOverSocketpair) {
  FdPair pair = MakeSocketPair();
  RoundTripOver(pair);
}

TEST(FdFramingTest, RoundTripOverPipe) {
  FdPair pair = MakePipe();
  RoundTripOver(pair);
}

// A 10 MB frame is far larger than a socket or pipe buffer: the writer sees
// partial writes and the reader short reads.
void LargeFrameAcrossThreads(FdPair& pair, size_t bytes) {
  const std::string payload = Payload(bytes, 8);
  std::thread writer([&] {
    const Status status = WriteFrame(pair.write_fd(), payload);
    EXPECT_TRUE(status.ok()) << status.message();
  });
  StatusOr<std::optional<std::string>> got = ReadFrame(pair.read_fd());
  writer.join();
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->size(), payload.size());
  EXPECT_TRUE(**got == payload);
}

TEST(FdFramingTest, TenMegabyteFrameOverSocketpair) {
  FdPair pair = MakeSocketPair();
  LargeFrameAcrossThreads(pair, 10'000'000);
}

TEST(FdFramingTest, TenMegabyteFrameOverPipe) {
  FdPair pair = MakePipe();
  LargeFrameAcrossThreads(pair, 10'000'000);
}

TEST(FdFramingTest, FrameOfExactlyMaxBytesOverSocketpair) {
  FdPair pair = MakeSocketPair();
  LargeFrameAcrossThreads(pair, kMaxFrameBytes);
}

TEST(FdFramingTest, ReadFrameRefusesLengthOverMaxWithoutReadingTheBody) {
  FdPair pair = MakePipe();
  // The write end stays open and no body follows: a reader waiting for the
  // body would block forever.
  WriteRaw(pair.write_fd(), Header(kMaxFrameBytes + 1));
  StatusOr<std::optional<std::string>> got = ReadFrame(pair.read_fd());
  ExpectError(got.status(), {"frame length 16777217 bytes", "limit of 16777216 bytes"});
}

TEST(FdFramingTest, ReadFrameHonoursMaxBytes) {
  FdPair pair = MakePipe();
  ASSERT_TRUE(WriteFrame(pair.write_fd(), Payload(101, 9)).ok());
  ExpectError(ReadFrame(pair.read_fd(), 100).status(), {"frame length 101 bytes", "limit of 100 bytes"});
}

TEST(FdFramingTest, ReadFrameOfGarbagePrefixIsRefused) {
  FdPair pair = MakeSocketPair();
  WriteRaw(pair.write_fd(), "GET / HTTP/1.1\r\n");
  ExpectError(ReadFrame(pair.read_fd()).status(), {"frame length 542393671 bytes"});
}

TEST(FdFramingTest, TruncatedFrameAtEndOfFile) {
  FdPair pair = MakePipe();
  WriteRaw(pair.write_fd(), EncodeFrame(Payload(10, 10)).substr(0, 4 + 6));
  pair.CloseWrite();
  ExpectError(ReadFrame(pair.read_fd()).status(), {"truncated frame: 6 of 10 bytes"});
}

TEST(FdFramingTest, TruncatedHeaderAtEndOfFile) {
  FdPair pair = MakeSocketPair();
  WriteRaw(pair.write_fd(), Header(10).substr(0, 3));
  pair.CloseWrite();
  ExpectError(ReadFrame(pair.read_fd()).status(), {"truncated frame header: 3 of 4 bytes"});
}

TEST(FdFramingTest, WriteFrameRefusesOversizedPayload) {
  FdPair pair = MakeSocketPair();
  const std::string payload(kMaxFrameBytes + 1, 'x');
  ExpectError(WriteFrame(pair.write_fd(), payload), {"16777217 bytes", "frame limit of 16777216 bytes"});
  pair.CloseWrite();
  StatusOr<std::optional<std::string>> got = ReadFrame(pair.read_fd());
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_FALSE(got->has_value()) << "something was written";
}

TEST(FdFramingTest, WriteToClosedSocketPeerIsAnErrorNotSigpipe) {
  FdPair pair = MakeSocketPair();
  pair.CloseRead();
  // With SIGPIPE's default action a raised signal would kill the test binary.
  ExpectError(WriteFrame(pair.write_fd(), "anyone there?"), {"writing a frame", "Broken pipe"});
}

TEST(FdFramingTest, WriteToClosedPipeReaderIsAnErrorNotSigpipe) {
  FdPair pair = MakePipe();
  pair.CloseRead();
  ExpectError(WriteFrame(pair.write_fd(), "anyone there?"), {"writing a frame", "Broken pipe"});
  // The SIGPIPE the write raised was consumed, not left pending for later.
  sigset_t pending;
  sigemptyset(&pending);
  ASSERT_EQ(sigpending(&pending), 0);
  EXPECT_EQ(sigismember(&pending, SIGPIPE), 0);
}

std::atomic<int> interruptions{0};
void CountInterruption(int) { interruptions.fetch_add(1); }

TEST(FdFramingTest, SignalsDuringBlockedWritesAndReadsAreRetried) {
  // A handler without SA_RESTART: blocked write() and read() fail with EINTR
  // (or return short) when it runs.
  struct sigaction action {};
  struct sigaction old_action {};
  action.sa_handler = CountInterruption;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &action, &old_action), 0);

  FdPair pair = MakePipe();
  const std::string payload = Payload(4'000'000, 11);
  std::atomic<bool> written{false};
  std::thread writer([&] {
    const Status status = WriteFrame(pair.write_fd(), payload);
    EXPECT_TRUE(status.ok()) << status.message();
    written = true;
  });
  // The pipe fills and the writer blocks; interrupt it several times.
  for (int i = 0; i < 5 && !written; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pthread_kill(writer.native_handle(), SIGUSR1);
  }
  StatusOr<std::optional<std::string>> got = ReadFrame(pair.read_fd());
  writer.join();
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_TRUE(got->has_value());
  EXPECT_TRUE(**got == payload);

  // A reader blocked on an empty pipe, interrupted, then given a frame.
  std::optional<StatusOr<std::optional<std::string>>> read_result;
  std::thread reader([&] { read_result.emplace(ReadFrame(pair.read_fd())); });
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pthread_kill(reader.native_handle(), SIGUSR1);
  }
  ASSERT_TRUE(WriteFrame(pair.write_fd(), "after the signals").ok());
  reader.join();
  ASSERT_TRUE(read_result->ok()) << read_result->status().message();
  EXPECT_EQ(***read_result, "after the signals");

  EXPECT_GT(interruptions.load(), 0);
  sigaction(SIGUSR1, &old_action, nullptr);
}

// ---- protobuf messages as payloads ----

TEST(ProtoFramingTest, RequestWithSubmitRoundTrips) {
  proto::Request request;
  proto::SubmitRequest* submit = request.mutable_submit();
  submit->mutable_spec()->set_yaml("model: {path: base}\ndata: {train: t.jsonl}\noutput: {dir: out}\n");
  submit->mutable_spec()->set_source("/home/ana/llama.yaml");
  submit->mutable_spec()->set_base_dir("/home/ana");
  submit->set_name("llama");
  submit->set_priority(-3);
  proto::Request list;
  list.mutable_list()->set_all(true);

  FrameDecoder decoder;
  Feed(decoder, EncodeFrame(Serialize(request)) + EncodeFrame(Serialize(list)));
  const std::vector<std::string> payloads = Drain(decoder);
  ASSERT_EQ(payloads.size(), 2u);

  proto::Request got;
  ASSERT_TRUE(ParseFrame(payloads[0], &got).ok());
  ASSERT_EQ(got.kind_case(), proto::Request::kSubmit);
  EXPECT_EQ(got.submit().spec().yaml(), submit->spec().yaml());
  EXPECT_EQ(got.submit().spec().source(), "/home/ana/llama.yaml");
  EXPECT_EQ(got.submit().spec().base_dir(), "/home/ana");
  EXPECT_EQ(got.submit().name(), "llama");
  EXPECT_EQ(got.submit().priority(), -3);
  ASSERT_TRUE(ParseFrame(payloads[1], &got).ok());  // clears the earlier message
  EXPECT_EQ(got.kind_case(), proto::Request::kList);
  EXPECT_TRUE(got.list().all());
}

TEST(ProtoFramingTest, WorkerEventsRoundTrip) {
  proto::WorkerEvent progress;
  progress.mutable_progress()->set_step(12);
  progress.mutable_progress()->set_total_steps(100);
  progress.mutable_progress()->set_loss(1.875);
  proto::WorkerEvent finished;
  finished.mutable_finished()->set_stopped(true);
  finished.mutable_finished()->set_output_path("/jobs/7/out/adapter");

  FdPair pair = MakeSocketPair();
  ASSERT_TRUE(WriteFrame(pair.write_fd(), Serialize(progress)).ok());
  ASSERT_TRUE(WriteFrame(pair.write_fd(), Serialize(finished)).ok());
  pair.CloseWrite();

  // The daemon's way: bytes as they come, through a decoder.
  FrameDecoder decoder;
  char chunk[7];
  for (;;) {
    const ssize_t n = ::read(pair.read_fd(), chunk, sizeof chunk);
    ASSERT_GE(n, 0);
    if (n == 0) break;
    decoder.Feed(chunk, static_cast<size_t>(n));
  }
  const std::vector<std::string> payloads = Drain(decoder);
  ASSERT_EQ(payloads.size(), 2u);
  EXPECT_TRUE(decoder.AtEndOfStream().ok());

  proto::WorkerEvent got;
  ASSERT_TRUE(ParseFrame(payloads[0], &got).ok());
  ASSERT_EQ(got.kind_case(), proto::WorkerEvent::kProgress);
  EXPECT_EQ(got.progress().step(), 12);
  EXPECT_EQ(got.progress().total_steps(), 100);
  EXPECT_EQ(got.progress().loss(), 1.875);
  ASSERT_TRUE(ParseFrame(payloads[1], &got).ok());
  ASSERT_EQ(got.kind_case(), proto::WorkerEvent::kFinished);
  EXPECT_TRUE(got.finished().stopped());
  EXPECT_EQ(got.finished().output_path(), "/jobs/7/out/adapter");
}

TEST(ProtoFramingTest, GarbagePayloadIsNotAValidRequest) {
  proto::Request request;
  // Field 1 (submit) declares 5 bytes and holds 2.
  ExpectError(ParseFrame(std::string("\x0a\x05" "ab", 4), &request),
              {"not a valid trainerd.proto.Request", "(4 bytes)"});
  // An unterminated varint tag.
  ExpectError(ParseFrame(std::string(8, '\xff'), &request), {"not a valid trainerd.proto.Request"});
  proto::WorkerEvent event;
  ExpectError(ParseFrame(std::string(8, '\xff'), &event), {"not a valid trainerd.proto.WorkerEvent"});
}

}  // namespace
}  // namespace trainerd
