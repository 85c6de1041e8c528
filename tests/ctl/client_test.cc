// trainerd_client (ctl/client.h) against raw unix-socket peers written here:
// a peer reads one Request frame and answers with whatever bytes the test
// gives it — good Replies, or a truncated frame, garbage, an oversized length,
// an early close — so every failure mode can be produced on demand. These
// peers stand in for trainerd only in this test. Also: where the client looks
// for the socket (ResolveSocketPath).
#include "ctl/client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/framing.h"
#include "common/proto_framing.h"
#include "tests/temp_dir.h"

namespace trainerd::client {
namespace {

using trainerd::testing::TempDir;

std::string Frame(const proto::Reply& reply) { return EncodeFrame(Serialize(reply)); }

std::string Header(uint32_t n) {
  std::string h(4, '\0');
  for (int i = 0; i < 4; ++i) h[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return h;
}

// Listens on `path`; Serve answers one connection on a thread.
class RawPeer {
 public:
  explicit RawPeer(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
    EXPECT_EQ(::listen(fd_, 4), 0);
  }
  ~RawPeer() {
    if (thread_.joinable()) thread_.join();
    ::close(fd_);
  }

  // Accepts one connection, reads `requests` Request frames, writing
  // answers[i] after request i, then closes it.
  void Serve(std::vector<std::string> answers) {
    thread_ = std::thread([this, answers = std::move(answers)] {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 10'000) != 1) return;  // no client: give up rather than hang the test
      const int conn = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) return;
      for (const std::string& answer : answers) {
        auto frame = ReadFrame(conn);
        if (!frame.ok() || !frame->has_value()) break;
        proto::Request request;
        if (ParseFrame(**frame, &request).ok()) requests_.push_back(request);
        if (!answer.empty() && ::write(conn, answer.data(), answer.size()) < 0) break;
      }
      ::close(conn);
    });
  }
  void Serve(std::string answer) { Serve(std::vector<std::string>{std::move(answer)}); }

  // The requests read; call after the client is done (joins the thread).
  const std::vector<proto::Request>& requests() {
    if (thread_.joinable()) thread_.join();
    return requests_;
  }

 private:
  int fd_ = -1;
  std::thread thread_;
  std::vector<proto::Request> requests_;
};

proto::Request StatusRequest(int64_t id) {
  proto::Request r;
  r.mutable_status()->set_job_id(id);
  return r;
}

proto::Request LogsFollow(int64_t id) {
  proto::Request r;
  r.mutable_logs()->set_job_id(id);
  r.mutable_logs()->set_follow(true);
  return r;
}

proto::Reply StatusReply(int64_t id) {
  proto::Reply reply;
  reply.mutable_status()->mutable_job()->set_id(id);
  return reply;
}

proto::Reply LogLine(const std::string& text) {
  proto::Reply reply;
  reply.mutable_logs()->add_lines()->set_text(text);
  return reply;
}

proto::Reply EndOfStream() {
  proto::Reply reply;
  reply.set_end_of_stream(true);
  return reply;
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()); }

  void ExpectContains(const Status& status, const std::vector<std::string>& parts) {
    ASSERT_FALSE(status.ok());
    for (const std::string& part : parts) {
      EXPECT_NE(status.message().find(part), std::string::npos) << "lacks \"" << part << "\": " << status.message();
    }
  }

  TempDir dir_;
  const std::string path_ = dir_ / "trainerd.sock";
};

TEST_F(ClientTest, CallSendsOneFramedRequestAndReturnsTheReply) {
  RawPeer peer(path_);
  peer.Serve(Frame(StatusReply(42)));
  Connection c;
  ASSERT_TRUE(c.Connect(path_).ok());
  StatusOr<proto::Reply> reply = c.Call(StatusRequest(42));
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  EXPECT_EQ(reply->status().job().id(), 42);
  EXPECT_EQ(c.failure(), Failure::kNone);
  ASSERT_EQ(peer.requests().size(), 1u);
  EXPECT_EQ(peer.requests()[0].status().job_id(), 42);
}

TEST_F(ClientTest, AnErrorReplyIsAnAnswerNotAFailure) {
  proto::Reply error;
  error.mutable_error()->set_code(proto::ERROR_CODE_NOT_FOUND);
  error.mutable_error()->set_message("no job 9");
  RawPeer peer(path_);
  peer.Serve(Frame(error));
  Connection c;
  ASSERT_TRUE(c.Connect(path_).ok());
  StatusOr<proto::Reply> reply = c.Call(StatusRequest(9));
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  EXPECT_EQ(reply->error().code(), proto::ERROR_CODE_NOT_FOUND);
  EXPECT_EQ(reply->error().message(), "no job 9");
}

TEST_F(ClientTest, SeveralRequestsOnOneConnection) {
  RawPeer peer(path_);
  peer.Serve(std::vector<std::string>{Frame(StatusReply(1)), Frame(StatusReply(2))});
  Connection c;
  ASSERT_TRUE(c.Connect(path_).ok());
  EXPECT_EQ(c.Call(StatusRequest(1))->status().job().id(), 1);
  EXPECT_EQ(c.Call(StatusRequest(2))->status().job().id(), 2);
}

TEST_F(ClientTest, CloseWithoutAReplyIsAConnectionLost) {
  RawPeer peer(path_);
  peer.Serve("");
  Connection c;
  ASSERT_TRUE(c.Connect(path_).ok());
  StatusOr<proto::Reply> reply = c.Call(StatusRequest(1));
  ExpectContains(reply.status(), {path_, "closed the connection without sending the answer to a status request"});
  EXPECT_EQ(c.failure(), Failure::kConnectionLost);
  EXPECT_FALSE(c.connected());
}

TEST_F(ClientTest, TruncatedFrameIsAConnectionLost) {
  RawPeer peer(path_);
  peer.Serve(Header(100) + std::string(10, 'x'));
  Connection c;
  ASSERT_TRUE(c.Connect(path_).ok());
  StatusOr<proto::Reply> reply = c.Call(StatusRequest(1));
  ExpectContains(reply.status(), {path_, "truncated frame: 10 of 100 bytes"});
  EXPECT_EQ(c.failure(), Failure::kConnectionLost);
}

TEST_F(ClientTest, TruncatedHeaderIsAConnectionLost) {
  RawPeer peer(path_);
  peer.Serve(std::string("\x05\x00", 2));
  Connection c;
  ASSERT_TRUE(c.Connect(path_).ok());
  StatusOr<proto::Reply> reply = c.Call(StatusRequest(1));
  ExpectContains(reply.status(), {path_, "truncated frame header"});
  EXPECT_EQ(c.failure(), Failure::kConnectionLost);
}

TEST_F(ClientTest, UnparsableReplyIsAProtocolError) {
  RawPeer peer(path_);
  peer.Serve(EncodeFrame(std::string("\xff\xff\xff\xff", 4)));
  Connection c;
  ASSERT_TRUE(c.Connect(path_).ok());
  StatusOr<proto::Reply> reply = c.Call(StatusRequest(1));
  ExpectContains(reply.status(), {path_, "not a valid trainerd.proto.Reply", "same version"});
  EXPECT_EQ(c.failure(), Failure::kProtocol);
}

TEST_F(ClientTest, OversizedFrameIsAProtocolError) {
  RawPeer peer(path_);
  peer.Serve(Header(kMaxFrameBytes + 1));
  Connection c;
  ASSERT_TRUE(c.Connect(path_).ok());
  StatusOr<proto::Reply> reply = c.Call(StatusRequest(1));
  ExpectContains(reply.status(), {path_, "exceeds the limit"});
  EXPECT_EQ(c.failure(), Failure::kProtocol);
}

TEST_F(ClientTest, ReplyOfTheWrongKindIsAProtocolError) {
  proto::Reply list;
  list.mutable_list();
  RawPeer peer(path_);
  peer.Serve(Frame(list));
  Connection c;
  ASSERT_TRUE(c.Connect(path_).ok());
  StatusOr<proto::Reply> reply = c.Call(StatusRequest(1));
  ExpectContains(reply.status(), {"answered a status request with a list reply"});
  EXPECT_EQ(c.failure(), Failure::kProtocol);
}

TEST_F(ClientTest, StreamPassesEveryReplyThroughTheEndOfStream) {
  RawPeer peer(path_);
  peer.Serve(Frame(LogLine("a")) + Frame(LogLine("b")) + Frame(EndOfStream()));
  Connection c;
  ASSERT_TRUE(c.Connect(path_).ok());
  std::vector<proto::Reply> got;
  Status s = c.Stream(LogsFollow(3), [&](const proto::Reply& r) { got.push_back(r); });
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].logs().lines(0).text(), "a");
  EXPECT_EQ(got[1].logs().lines(0).text(), "b");
  EXPECT_TRUE(got[2].end_of_stream());
  EXPECT_TRUE(peer.requests()[0].logs().follow());
}

TEST_F(ClientTest, StreamEndsAtAnErrorReply) {
  proto::Reply error;
  error.mutable_error()->set_code(proto::ERROR_CODE_INTERNAL);
  error.mutable_error()->set_message("follow/wait arrive with the supervisor");
  RawPeer peer(path_);
  peer.Serve(Frame(error));
  Connection c;
  ASSERT_TRUE(c.Connect(path_).ok());
  std::vector<proto::Reply> got;
  ASSERT_TRUE(c.Stream(LogsFollow(3), [&](const proto::Reply& r) { got.push_back(r); }).ok());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].error().code(), proto::ERROR_CODE_INTERNAL);
}

TEST_F(ClientTest, StreamClosedBeforeItsEndIsAConnectionLost) {
  RawPeer peer(path_);
  peer.Serve(Frame(LogLine("a")));
  Connection c;
  ASSERT_TRUE(c.Connect(path_).ok());
  int lines = 0;
  Status s = c.Stream(LogsFollow(3), [&](const proto::Reply&) { ++lines; });
  ExpectContains(s, {path_, "closed the connection before the end of the answer to a logs request"});
  EXPECT_EQ(c.failure(), Failure::kConnectionLost);
  EXPECT_EQ(lines, 1);
}

TEST_F(ClientTest, StreamTruncatedMidAnswerIsAConnectionLost) {
  RawPeer peer(path_);
  peer.Serve(Frame(LogLine("a")) + Frame(LogLine("bbbbbbbbbb")).substr(0, 7));
  Connection c;
  ASSERT_TRUE(c.Connect(path_).ok());
  Status s = c.Stream(LogsFollow(3), [](const proto::Reply&) {});
  ExpectContains(s, {"truncated frame"});
  EXPECT_EQ(c.failure(), Failure::kConnectionLost);
}

TEST_F(ClientTest, MissingSocketIsNoDaemonAndSaysWhatToDo) {
  Connection c;
  Status s = c.Connect(SocketPath{path_, "the system daemon's socket", false});
  ExpectContains(s, {path_, "the system daemon's socket", "no such socket", "is trainerd running?",
                     "systemctl start trainerd", "TRAINERD_SOCKET"});
  EXPECT_EQ(c.failure(), Failure::kNoDaemon);
  EXPECT_FALSE(c.connected());
}

TEST_F(ClientTest, SocketNobodyListensOnIsNoDaemon) {
  // Bound but not listening: connect is refused, as on a dead daemon's socket.
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  Connection c;
  Status s = c.Connect(SocketPath{path_, "from --socket", true});
  ExpectContains(s, {path_, "from --socket", "nobody is listening", "is trainerd running with this socket?"});
  EXPECT_EQ(c.failure(), Failure::kNoDaemon);
  ::close(fd);
}

TEST_F(ClientTest, SocketWeMayNotUseIsPermissionDenied) {
  RawPeer peer(path_);
  ASSERT_EQ(::chmod(path_.c_str(), 0), 0);
  if (::geteuid() != 0) {
    Connection c;
    Status s = c.Connect(path_);
    ExpectContains(s, {path_, "permission denied", "trainerd group"});
    EXPECT_EQ(c.failure(), Failure::kPermissionDenied);
    return;
  }
  // Root may connect to any socket: try as nobody in a child process (the
  // temporary folder is 0700 root's, the socket 0000; either refuses).
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    Connection c;
    Status s = c.Connect(path_);
    const bool named = s.message().find(path_) != std::string::npos &&
                       s.message().find("permission denied") != std::string::npos;
    ::_exit(c.failure() == Failure::kPermissionDenied && named ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: not a permission-denied failure naming the path; 2: setuid failed";
}

TEST_F(ClientTest, PathTooLongForAUnixSocket) {
  Connection c;
  Status s = c.Connect(std::string(200, 'x'));
  ExpectContains(s, {"200 bytes long", "at most 107"});
  EXPECT_EQ(c.failure(), Failure::kConnectFailed);
}

TEST_F(ClientTest, CallWithoutConnectingFails) {
  Connection c;
  StatusOr<proto::Reply> reply = c.Call(StatusRequest(1));
  EXPECT_FALSE(reply.ok());
  EXPECT_EQ(c.failure(), Failure::kConnectionLost);
}

TEST(ReplyKindTest, EveryRequestKindHasItsReplyKind) {
  EXPECT_EQ(ReplyKindFor(proto::Request::kSubmit), proto::Reply::kSubmit);
  EXPECT_EQ(ReplyKindFor(proto::Request::kList), proto::Reply::kList);
  EXPECT_EQ(ReplyKindFor(proto::Request::kStatus), proto::Reply::kStatus);
  EXPECT_EQ(ReplyKindFor(proto::Request::kCancel), proto::Reply::kCancel);
  EXPECT_EQ(ReplyKindFor(proto::Request::kLogs), proto::Reply::kLogs);
  EXPECT_EQ(ReplyKindFor(proto::Request::kWait), proto::Reply::kWait);
  EXPECT_EQ(ReplyKindFor(proto::Request::kValidate), proto::Reply::kValidate);
  EXPECT_EQ(ReplyKindFor(proto::Request::KIND_NOT_SET), proto::Reply::KIND_NOT_SET);
}

using Vars = std::map<std::string, std::string>;

// ResolveSocketPath, with a fixed environment and a temporary runtime folder.
class ResolveSocketPathTest : public ::testing::Test {
 protected:
  // Creates <dir>/trainerd/trainerd.sock (any file will do: only existence counts).
  std::string MakeUserSocket() {
    std::filesystem::create_directories(dir_ / "trainerd");
    const std::string path = dir_ / "trainerd/trainerd.sock";
    std::ofstream(path) << "";
    return path;
  }
  TempDir dir_;
  static constexpr uid_t kNoSuchUid = 3'999'999'999u;  // /run/user/<it> does not exist
};

TEST_F(ResolveSocketPathTest, FlagWinsOverEverything) {
  MakeUserSocket();
  EnvironmentView env(Vars{{"TRAINERD_SOCKET", "/env.sock"}, {"XDG_RUNTIME_DIR", dir_.path()}});
  SocketPath p = ResolveSocketPath("/flag.sock", env, kNoSuchUid);
  EXPECT_EQ(p.path, "/flag.sock");
  EXPECT_EQ(p.origin, "from --socket");
  EXPECT_TRUE(p.named_by_user);
}

TEST_F(ResolveSocketPathTest, EnvironmentVariableNext) {
  MakeUserSocket();
  EnvironmentView env(Vars{{"TRAINERD_SOCKET", "/env.sock"}, {"XDG_RUNTIME_DIR", dir_.path()}});
  SocketPath p = ResolveSocketPath("", env, kNoSuchUid);
  EXPECT_EQ(p.path, "/env.sock");
  EXPECT_EQ(p.origin, "from $TRAINERD_SOCKET");
  EXPECT_TRUE(p.named_by_user);
}

TEST_F(ResolveSocketPathTest, UserDaemonSocketWhenItExists) {
  const std::string user = MakeUserSocket();
  EnvironmentView env(Vars{{"XDG_RUNTIME_DIR", dir_.path()}});
  SocketPath p = ResolveSocketPath("", env, kNoSuchUid);
  EXPECT_EQ(p.path, user);
  EXPECT_EQ(p.origin, "the user daemon's socket");
  EXPECT_FALSE(p.named_by_user);
}

TEST_F(ResolveSocketPathTest, SystemSocketWhenNoUserDaemonSocket) {
  EnvironmentView env(Vars{{"XDG_RUNTIME_DIR", dir_.path()}});
  SocketPath p = ResolveSocketPath("", env, kNoSuchUid);
  EXPECT_EQ(p.path, "/run/trainerd/trainerd.sock");
  EXPECT_EQ(p.origin, "the system daemon's socket");
}

TEST_F(ResolveSocketPathTest, RelativeRuntimeDirIsIgnored) {
  EnvironmentView env(Vars{{"XDG_RUNTIME_DIR", "relative/run"}});
  EXPECT_EQ(ResolveSocketPath("", env, kNoSuchUid).path, "/run/trainerd/trainerd.sock");
}

TEST_F(ResolveSocketPathTest, EmptyEnvironmentVariableIsUnset) {
  EnvironmentView env(Vars{{"TRAINERD_SOCKET", ""}});
  EXPECT_EQ(ResolveSocketPath("", env, kNoSuchUid).path, "/run/trainerd/trainerd.sock");
}

}  // namespace
}  // namespace trainerd::client
