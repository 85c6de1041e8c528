// The socket server over a real unix socket: the server runs its io_context on
// a background thread; clients are blocking sockets using WriteFrame/ReadFrame.
#include "daemon/server.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/framing.h"
#include "common/proto_framing.h"

namespace trainerd {
namespace {

namespace asio = boost::asio;

constexpr int64_t kEndlessJob = 99;  // LogsRequest{follow} for it never ends

// List → empty ListReply; Status → the job_id echoed, with the peer's uid as
// owner_uid and pid as name; Logs{follow} → 3 LogsReply posted one by one, then
// end_of_stream (for kEndlessJob: one LogsReply, then wait for the close).
class TestHandler : public RequestHandler {
 public:
  explicit TestHandler(asio::io_context& io) : io_(io) {}

  void Handle(const proto::Request& request, const PeerCredentials& peer,
              ReplyWriter& writer) override {
    proto::Reply reply;
    switch (request.kind_case()) {
      case proto::Request::kList:
        reply.mutable_list();
        writer.End(reply);
        return;
      case proto::Request::kStatus: {
        proto::Job* job = reply.mutable_status()->mutable_job();
        job->set_id(request.status().job_id());
        job->set_owner_uid(peer.uid);
        job->set_name(std::to_string(peer.pid));
        writer.End(reply);
        return;
      }
      case proto::Request::kLogs:
        if (request.logs().job_id() == kEndlessJob) {
          reply.mutable_logs()->add_lines()->set_text("first");
          writer.Send(reply);
          endless_ = std::make_unique<ReplyWriter>(writer);
          writer.OnClose([this] {
            closed_seen_ = true;
            endless_.reset();  // drops the session
          });
          return;
        }
        StreamLine(writer, 0);
        return;
      default:
        reply.mutable_error()->set_code(proto::ERROR_CODE_BAD_REQUEST);
        writer.End(reply);
    }
  }

  std::atomic<bool> closed_seen_{false};

 private:
  // Sends line `i` later, from the io_context, as a handler that streams would.
  void StreamLine(ReplyWriter writer, int i) {
    asio::post(io_, [this, writer, i]() mutable {
      if (!writer.open()) return;
      if (i == 3) {
        writer.EndStream();
        return;
      }
      proto::Reply reply;
      reply.mutable_logs()->add_lines()->set_text("line " + std::to_string(i));
      writer.Send(reply);
      StreamLine(writer, i + 1);
    });
  }

  asio::io_context& io_;
  std::unique_ptr<ReplyWriter> endless_;
};

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/server_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/run/trainerd.sock";  // the folder does not exist yet
    server_ = std::make_unique<Server>(io_, handler_);
    io_thread_ = std::thread([this] { io_.run(); });
  }

  void TearDown() override {
    OnIo([this] { server_->Stop(); });
    work_.reset();
    io_.stop();
    io_thread_.join();
    server_.reset();
    std::system(("rm -rf " + dir_).c_str());
  }

  // Runs `fn` on the io thread and waits for it.
  void OnIo(std::function<void()> fn) {
    std::promise<void> done;
    asio::post(io_, [&] {
      fn();
      done.set_value();
    });
    done.get_future().wait();
  }

  Status Listen(mode_t mode = 0600) {
    Status status;
    OnIo([&] { status = server_->Listen(path_, mode); });
    return status;
  }

  static int Connect(const std::string& path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
    timeval tv{10, 0};  // a broken server fails the test instead of hanging it
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
  }
  int Connect() { return Connect(path_); }

  static void Send(int fd, const proto::Request& request) {
    ASSERT_TRUE(WriteFrame(fd, Serialize(request)).ok());
  }
  static void SendRaw(int fd, const std::string& bytes) {
    ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  static proto::Reply Receive(int fd) {
    proto::Reply reply;
    auto frame = ReadFrame(fd);
    EXPECT_TRUE(frame.ok()) << frame.status().message();
    if (!frame.ok()) return reply;
    EXPECT_TRUE(frame->has_value()) << "EOF instead of a reply";
    if (!frame->has_value()) return reply;
    EXPECT_TRUE(ParseFrame(**frame, &reply).ok());
    return reply;
  }
  // True when the server closed the connection (EOF or reset, no more replies).
  static bool SeesClose(int fd) {
    auto frame = ReadFrame(fd);
    return !frame.ok() ? frame.status().message().find("timed out") == std::string::npos &&
                             frame.status().message().find("unavailable") == std::string::npos
                       : !frame->has_value();
  }

  static proto::Request ListRequest() {
    proto::Request r;
    r.mutable_list();
    return r;
  }
  static proto::Request StatusRequest(int64_t id) {
    proto::Request r;
    r.mutable_status()->set_job_id(id);
    return r;
  }
  static proto::Request LogsFollow(int64_t id) {
    proto::Request r;
    r.mutable_logs()->set_job_id(id);
    r.mutable_logs()->set_follow(true);
    return r;
  }
  static std::string Header(uint32_t n) {
    std::string h(4, '\0');
    for (int i = 0; i < 4; ++i) h[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return h;
  }

  // Checks that a connection opened before a bad one still gets answers.
  void ExpectStillServes(int fd) {
    Send(fd, StatusRequest(42));
    EXPECT_EQ(Receive(fd).status().job().id(), 42);
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  TestHandler handler_{io_};
  std::unique_ptr<Server> server_;
  std::thread io_thread_;
  std::string dir_;
  std::string path_;
};

TEST_F(ServerTest, OneRequestOneReply) {
  ASSERT_TRUE(Listen().ok());
  int fd = Connect();
  Send(fd, ListRequest());
  proto::Reply reply = Receive(fd);
  EXPECT_TRUE(reply.has_list());
  EXPECT_EQ(reply.list().jobs_size(), 0);
  EXPECT_EQ(reply.error().code(), proto::ERROR_CODE_NONE);
  close(fd);
}

TEST_F(ServerTest, RequestsOnOneConnectionAreAnsweredInOrder) {
  ASSERT_TRUE(Listen().ok());
  int fd = Connect();
  // All at once: the stream must end before the next request is answered.
  std::string bytes = EncodeFrame(Serialize(StatusRequest(1))) +
                      EncodeFrame(Serialize(LogsFollow(5))) +
                      EncodeFrame(Serialize(StatusRequest(2))) + EncodeFrame(Serialize(ListRequest()));
  SendRaw(fd, bytes);
  EXPECT_EQ(Receive(fd).status().job().id(), 1);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(Receive(fd).has_logs());
  EXPECT_TRUE(Receive(fd).end_of_stream());
  EXPECT_EQ(Receive(fd).status().job().id(), 2);
  EXPECT_TRUE(Receive(fd).has_list());
  close(fd);
}

TEST_F(ServerTest, StreamsThreeRepliesThenEndOfStream) {
  ASSERT_TRUE(Listen().ok());
  int fd = Connect();
  Send(fd, LogsFollow(7));
  for (int i = 0; i < 3; ++i) {
    proto::Reply reply = Receive(fd);
    ASSERT_TRUE(reply.has_logs());
    ASSERT_EQ(reply.logs().lines_size(), 1);
    EXPECT_EQ(reply.logs().lines(0).text(), "line " + std::to_string(i));
    EXPECT_FALSE(reply.end_of_stream());
  }
  EXPECT_TRUE(Receive(fd).end_of_stream());
  // The connection serves the next request after the stream.
  ExpectStillServes(fd);
  close(fd);
}

TEST_F(ServerTest, PeerCredentialsAreTheClientProcess) {
  ASSERT_TRUE(Listen().ok());
  int fd = Connect();
  Send(fd, StatusRequest(3));
  proto::Reply reply = Receive(fd);
  EXPECT_EQ(reply.status().job().owner_uid(), getuid());
  EXPECT_EQ(reply.status().job().name(), std::to_string(getpid()));
  close(fd);
}

TEST_F(ServerTest, GarbageClosesOnlyThatConnection) {
  ASSERT_TRUE(Listen().ok());
  int good = Connect();
  Send(good, ListRequest());
  EXPECT_TRUE(Receive(good).has_list());
  int bad = Connect();
  SendRaw(bad, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(SeesClose(bad));
  ExpectStillServes(good);
  close(bad);
  close(good);
}

TEST_F(ServerTest, TruncatedFrameThenEofClosesTheConnection) {
  ASSERT_TRUE(Listen().ok());
  int good = Connect();
  int bad = Connect();
  SendRaw(bad, Header(100) + std::string(10, 'x'));
  shutdown(bad, SHUT_WR);
  EXPECT_TRUE(SeesClose(bad));
  ExpectStillServes(good);
  close(bad);
  close(good);
}

TEST_F(ServerTest, HalfCloseAfterAWholeRequestStillGetsTheAnswer) {
  ASSERT_TRUE(Listen().ok());
  int fd = Connect();
  Send(fd, StatusRequest(8));
  shutdown(fd, SHUT_WR);
  EXPECT_EQ(Receive(fd).status().job().id(), 8);
  EXPECT_TRUE(SeesClose(fd));
  close(fd);
}

TEST_F(ServerTest, OversizedLengthClosesTheConnection) {
  ASSERT_TRUE(Listen().ok());
  int good = Connect();
  int bad = Connect();
  SendRaw(bad, Header(kMaxFrameBytes + 1));
  EXPECT_TRUE(SeesClose(bad));
  ExpectStillServes(good);
  close(bad);
  close(good);
}

TEST_F(ServerTest, PayloadThatIsNotARequestClosesTheConnection) {
  ASSERT_TRUE(Listen().ok());
  int good = Connect();
  int bad = Connect();
  ASSERT_TRUE(WriteFrame(bad, std::string("\xff\xff\xff\xff", 4)).ok());
  EXPECT_TRUE(SeesClose(bad));
  ExpectStillServes(good);
  close(bad);
  close(good);
}

TEST_F(ServerTest, TwoHundredClientsAtOnce) {
  ASSERT_TRUE(Listen().ok());
  constexpr int kClients = 200;
  std::vector<std::thread> clients;
  std::atomic<int> answered{0};
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      int fd = Connect();
      Send(fd, StatusRequest(1000 + i));
      if (Receive(fd).status().job().id() == 1000 + i) ++answered;
      close(fd);
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(answered.load(), kClients);
}

TEST_F(ServerTest, ListenReplacesAStaleSocketFile) {
  // A socket file nobody listens on, as a crashed daemon leaves it.
  std::system(("mkdir -p " + dir_ + "/run").c_str());
  int stale = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(stale, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(stale);
  struct stat st {};
  ASSERT_EQ(lstat(path_.c_str(), &st), 0);
  ASSERT_TRUE(S_ISSOCK(st.st_mode));

  Status status = Listen();
  ASSERT_TRUE(status.ok()) << status.message();
  int fd = Connect();
  ExpectStillServes(fd);
  close(fd);
}

TEST_F(ServerTest, ListenFailsWhileAnotherServerListens) {
  ASSERT_TRUE(Listen().ok());
  asio::io_context other_io;
  TestHandler other_handler(other_io);
  Server other(other_io, other_handler);
  Status status = other.Listen(path_, 0600);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("another trainerd is listening on " + path_), std::string::npos)
      << status.message();
  // The first server is untouched.
  int fd = Connect();
  ExpectStillServes(fd);
  close(fd);
}

TEST_F(ServerTest, ListenFailsOnARegularFileNamingIt) {
  std::system(("mkdir -p " + dir_ + "/run && echo hi > " + path_).c_str());
  Status status = Listen();
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(path_), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("not a socket"), std::string::npos) << status.message();
  struct stat st {};
  ASSERT_EQ(lstat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));  // left alone
}

TEST_F(ServerTest, SocketFileHasTheRequestedMode) {
  ASSERT_TRUE(Listen(0660).ok());
  struct stat st {};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
}

TEST_F(ServerTest, StopClosesOpenConnectionsAndTellsStreams) {
  ASSERT_TRUE(Listen().ok());
  int idle = Connect();
  Send(idle, ListRequest());
  EXPECT_TRUE(Receive(idle).has_list());
  int streaming = Connect();
  Send(streaming, LogsFollow(kEndlessJob));
  EXPECT_EQ(Receive(streaming).logs().lines(0).text(), "first");

  OnIo([this] { server_->Stop(); });
  EXPECT_TRUE(SeesClose(idle));
  EXPECT_TRUE(SeesClose(streaming));
  EXPECT_TRUE(handler_.closed_seen_.load());
  size_t sessions = 1;
  OnIo([&] { sessions = server_->session_count(); });
  EXPECT_EQ(sessions, 0u);
  struct stat st {};
  EXPECT_NE(lstat(path_.c_str(), &st), 0);  // the socket file is gone
  close(idle);
  close(streaming);
}

TEST_F(ServerTest, ClientClosingDuringAStreamIsSeenByTheHandler) {
  ASSERT_TRUE(Listen().ok());
  int fd = Connect();
  Send(fd, LogsFollow(kEndlessJob));
  EXPECT_EQ(Receive(fd).logs().lines(0).text(), "first");
  close(fd);
  for (int i = 0; i < 500 && !handler_.closed_seen_.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(handler_.closed_seen_.load());
}

TEST_F(ServerTest, AdoptsAListeningSocket) {
  std::system(("mkdir -p " + dir_ + "/run").c_str());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  Status status;
  OnIo([&] { status = server_->Adopt(fd); });
  ASSERT_TRUE(status.ok()) << status.message();
  int client = Connect();
  ExpectStillServes(client);
  close(client);
}

TEST(ListenFdFromSystemdTest, NoneWithoutSocketActivation) {
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_PID");
  auto fd = ListenFdFromSystemd();
  ASSERT_TRUE(fd.ok()) << fd.status().message();
  EXPECT_FALSE(fd->has_value());
}

}  // namespace
}  // namespace trainerd
